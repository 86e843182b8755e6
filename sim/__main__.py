"""The run simulator: forecast a 12-hour hidden-set run from logged attempts before spending one.

    python -m sim forecast --log attempts.jsonl [--log more.jsonl] --tasks DIR [--solutions PATH] --profile NAME
                           [--serving FILE] [--hidden-tasks 240] [--runs 50] [--sensitivity] [--sweep P1,P2]
                           [--compare-fifo] [--out DIR]
    python -m sim calibrate --stats attempts.stats.jsonl --profile NAME [--out serving.toml]
    python -m sim backtest LOG --tasks DIR [--solutions PATH] --profile NAME [--serving FILE]

The solver's own scheduler and selection run on a simulated clock (sim/run.py) with attempts drawn from the logs
(sim/pool.py) and a serving model of the engine (sim/serving.py; `--serving` defaults to
sim/serving_models/PROFILE.toml). The README gives the model's formulas and the drawing rules.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

from sim.backtest import backtest
from sim.calibrate import fit, read_windows, to_toml
from sim.forecast import build_inputs, forecast, one_run, sensitivity
from sim.pool import AttemptPool
from sim.report import sweep_table, text_report, timeline_png
from sim.serving import load_serving
from submission.attempts import read_log
from submission.config import ProfileError, load_profile
from submission.tasks import LoadError, load_tasks

SERVING_MODELS = Path(__file__).resolve().parent / "serving_models"


def _serving_for(args: argparse.Namespace, profile_name: str):
    path = Path(args.serving) if args.serving else SERVING_MODELS / f"{Path(profile_name).stem}.toml"
    return load_serving(path)


def _inputs(args: argparse.Namespace, records, hidden: int):
    tasks = [t for t in load_tasks(args.tasks, args.solutions).tasks if t.test_outputs is not None]
    if not tasks:
        raise LoadError(f"{args.tasks}: no task with known test outputs (pass --solutions)")
    prompts: dict[tuple[str, int], list[int]] = {}
    for r in records:
        if r.prompt_tokens:
            prompts.setdefault((r.task_id, r.test_index), []).append(r.prompt_tokens)
    prompt_tokens = {k: int(statistics.median(v)) for k, v in prompts.items()}
    return build_inputs(tasks, prompt_tokens, hidden, random.Random(0))


def cmd_forecast(args: argparse.Namespace) -> int:
    records = [r for path in args.log for r in read_log(path)]
    inputs, truth = _inputs(args, records, args.hidden_tasks)
    pool = AttemptPool(records, truth, args.forced_accuracy)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in [args.profile] + [p for p in (args.sweep or "").split(",") if p]:
        profile = load_profile(name)
        serving = _serving_for(args, name) if name == args.profile else load_serving(
            SERVING_MODELS / f"{Path(name).stem}.toml")
        started = time.perf_counter()
        result = forecast(profile.schedule, inputs, truth, pool, serving, runs=args.runs)
        elapsed = time.perf_counter() - started
        rows.append((name, result, len(inputs)))
        if name != args.profile:
            continue
        sens = sensitivity(profile.schedule, inputs, truth, pool, serving, runs=max(args.runs // 5, 4)) \
            if args.sensitivity else None
        report = text_report(name, result, truth, sens)
        run, engine = one_run(profile.schedule, inputs, truth, pool, serving, seed=0)
        png = timeline_png(run, engine.timeline, out / "timeline.png", f"{name}: one simulated run")
        (out / "report.txt").write_text(report + "\n")
        print(report)
        print(f"  ({args.runs} runs simulated in {elapsed:.1f} s)")
        print(f"report: {out / 'report.txt'}\ntimeline plot: {png}")
    if args.compare_fifo:  # the same profile with second attempts first in, first out (same seeds: paired)
        profile = load_profile(args.profile)
        fifo = replace(profile.schedule, second_by_confidence=False)
        result = forecast(fifo, inputs, truth, pool, _serving_for(args, args.profile), runs=args.runs)
        rows.insert(1, (f"{args.profile} FIFO 2nd", result, len(inputs)))
    if len(rows) > 1:
        table = sweep_table(rows)
        (out / "sweep.txt").write_text(table + "\n")
        print(table)
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    kv = profile.engine.kv_cache_memory_bytes  # a pinned cache size in bytes is not a token count: ask for it
    result = fit(read_windows(args.stats), args.kv_tokens, profile.engine.max_num_seqs)
    text = to_toml(result.model, f"fitted by python -m sim calibrate on {args.stats} ({result.windows} windows, "
                                 f"mean token error {100 * result.token_error:.1f}%)")
    print(text, end="")
    print(f"# fit error: predicted tokens per window off by {100 * result.token_error:.1f}% on average"
          + ("" if kv == 0 else f"; kv_tokens is --kv-tokens, not the profile's {kv} bytes"))
    if args.out:
        Path(args.out).write_text(text)
    return 0


def cmd_backtest(args: argparse.Namespace) -> int:
    records = read_log(args.log)
    inputs, truth = _inputs(args, records, 0)
    seen = {(r.task_id, r.test_index) for r in records}
    inputs = [i for i in inputs if i.key in seen]
    profile = load_profile(args.profile)
    result = backtest(records, inputs, truth, profile.schedule, _serving_for(args, args.profile))
    print(f"backtest of {args.log}: {result.matched} attempts matched")
    print(f"  start error  {result.start_error_s:8.1f} s (mean absolute)")
    print(f"  finish error {result.finish_error_s:8.1f} s")
    print(f"  score: logged {result.logged_score:.2f}, simulated {result.simulated_score:.2f}, "
          f"difference {result.simulated_score - result.logged_score:+.2f}")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim", description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    f = sub.add_parser("forecast", help="forecast score, unanswered inputs and sensitivity")
    f.add_argument("--log", action="append", required=True, help="attempt log(s) of earlier runs")
    f.add_argument("--tasks", required=True, type=Path)
    f.add_argument("--solutions", type=Path)
    f.add_argument("--profile", required=True)
    f.add_argument("--serving", help="serving model TOML (default sim/serving_models/PROFILE.toml)")
    f.add_argument("--hidden-tasks", type=int, default=240, help="tasks in the simulated set (made up beyond the "
                                                                  "labelled ones)")
    f.add_argument("--runs", type=int, default=50)
    f.add_argument("--forced-accuracy", type=float, default=0.08)
    f.add_argument("--sensitivity", action="store_true")
    f.add_argument("--sweep", help="more profiles to compare, comma-separated")
    f.add_argument("--compare-fifo", action="store_true",
                   help="also forecast the profile with second attempts first in, first out")
    f.add_argument("--out", default="out/simulate")
    c = sub.add_parser("calibrate", help="fit the serving model to a run's per-window engine statistics")
    c.add_argument("--stats", required=True, type=Path)
    c.add_argument("--profile", required=True)
    c.add_argument("--kv-tokens", type=int, required=True, help="the engine's KV-cache capacity in tokens")
    c.add_argument("--out", type=Path)
    b = sub.add_parser("backtest", help="replay a run's own log under its profile and compare")
    b.add_argument("log", type=Path)
    b.add_argument("--tasks", required=True, type=Path)
    b.add_argument("--solutions", type=Path)
    b.add_argument("--profile", required=True)
    b.add_argument("--serving")
    args = parser.parse_args(argv)
    try:
        return {"forecast": cmd_forecast, "calibrate": cmd_calibrate, "backtest": cmd_backtest}[args.command](args)
    except (LoadError, ProfileError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
