"""The run simulator: forecast a 12-hour hidden-set run from logged attempts before spending one.

    python -m sim forecast --log attempts.jsonl [--log more.jsonl] --tasks DIR [--solutions PATH] [--scenario FILE]
                           [--profile NAME] [--serving FILE] [--kv-tokens N] [--throughput TOK_S]
                           [--throughput-running N] [--throughput-context N] [--startup-s S] [--hidden-tasks 240]
                           [--test-inputs N] [--inputs-per-task 1:0.6,2:0.3,3:0.1] [--cap-first-single N]
                           [--cap-first-multi N] [--cap-second N] [--repair-caps N,N] [--cap-extra N]
                           [--max-in-flight N] [--throughput-noise SIGMA]
                           [--runs 50] [--bootstraps 1000] [--seed 0] [--sensitivity] [--sensitivity-step 0.05]
                           [--sensitivity-pairs 20] [--sweep KEY=V1,V2 | --sweep P1,P2] [--compare-fifo]
                           [--out DIR] [--json PATH] [--workers N]
    python -m sim calibrate --stats attempts.stats.jsonl --profile NAME --kv-tokens N [--out serving.toml]
    python -m sim backtest LOG --tasks DIR [--solutions PATH] --profile NAME [--serving FILE] [--trace STATS]

The solver's own scheduler and selection run on a simulated clock (sim/run.py) with attempts drawn from the logs
(sim/pool.py) and a serving model of the engine and its KV cache (sim/serving.py; `--serving` defaults to
sim/serving_models/PROFILE.toml). A scenario TOML (sim/scenario.py) holds the same fields as the options; options
given on the command line win. The README gives the model's formulas and the drawing rules. Runs are spread over
`--workers` processes (default: every core this process may use); the results do not depend on their number.
"""

from __future__ import annotations

import argparse
import json
import os
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
from sim.report import distribution_png, report_json, summary, sweep_table, text_report, timeline_png
from sim.scenario import (SERVING_MODELS, describe, for_profile, make_scenario, parse_counts, read_scenario, resolve,
                          variants)
from sim.serving import load_serving, trace_from_windows
from submission import engine_numbers
from submission.attempts import read_log
from submission.profiles import ProfileError, load_profile
from submission.tasks import LoadError, load_tasks

SCHEDULE_OPTIONS = ("cap_first_single", "cap_first_multi", "cap_second", "repair_caps", "cap_extra", "max_in_flight")


def _serving_for(args: argparse.Namespace, profile_name: str):
    path = Path(args.serving) if args.serving else SERVING_MODELS / f"{Path(profile_name).stem}.toml"
    return load_serving(path)


def _inputs(args: argparse.Namespace, records, hidden: int, test_inputs: int | None = None, per_task: tuple = ()):
    tasks = [t for t in load_tasks(args.tasks, args.solutions).tasks if t.test_outputs is not None]
    if not tasks:
        raise LoadError(f"{args.tasks}: no task with known test outputs (pass --solutions)")
    prompts: dict[tuple[str, int], list[int]] = {}
    for r in records:
        if r.prompt_tokens:
            prompts.setdefault((r.task_id, r.test_index), []).append(r.prompt_tokens)
    prompt_tokens = {k: int(statistics.median(v)) for k, v in prompts.items()}
    return build_inputs(tasks, prompt_tokens, hidden, random.Random(0), test_inputs, per_task)


def scenario_of(args: argparse.Namespace):
    """The scenario file (if any) with the options given on the command line on top."""
    from_file = read_scenario(args.scenario) if args.scenario else {}
    overrides = {"profile": args.profile, "serving": args.serving, "kv_tokens": args.kv_tokens,
                 "throughput_tok_s": args.throughput, "throughput_running": args.throughput_running,
                 "throughput_context": args.throughput_context, "startup_s": args.startup_s,
                 "tasks": args.hidden_tasks, "test_inputs": args.test_inputs, "inputs_per_task": args.inputs_per_task,
                 "throughput_noise": args.throughput_noise, "runs": args.runs, "bootstraps": args.bootstraps,
                 "seed": args.seed, "sensitivity": True if args.sensitivity else None,
                 "sensitivity_step": args.sensitivity_step, "sensitivity_pairs": args.sensitivity_pairs,
                 "forced_accuracy": args.forced_accuracy, "sweep": args.sweep,
                 "schedule": tuple((name, getattr(args, name)) for name in SCHEDULE_OPTIONS
                                   if getattr(args, name) is not None)}
    return make_scenario(from_file, overrides)


def cmd_forecast(args: argparse.Namespace) -> int:
    scenario = scenario_of(args)
    planned = variants(scenario)  # a bad sweep fails before the logs are read
    records = [r for path in args.log for r in read_log(path)]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, document = [], None
    inputs_by_shape: dict = {}
    for name, variant in planned:
        resolved = resolve(variant)
        shape = (variant.tasks, variant.test_inputs, variant.inputs_per_task, variant.forced_accuracy)
        if shape not in inputs_by_shape:
            inputs, truth = _inputs(args, records, variant.tasks, variant.test_inputs,
                                    parse_counts(variant.inputs_per_task))
            inputs_by_shape[shape] = (inputs, truth, AttemptPool(records, truth, variant.forced_accuracy))
        inputs, truth, pool = inputs_by_shape[shape]
        if document is None:
            print(describe(variant, resolved, len(inputs)))
            print(pool.turn_model.summary())
        started = time.perf_counter()
        result = forecast(resolved.schedule, inputs, truth, pool, resolved.serving, runs=variant.runs,
                          seed=variant.seed, throughput_noise=variant.throughput_noise,
                          bootstraps=variant.bootstraps, workers=args.workers, transfer=resolved.transfer)
        elapsed = time.perf_counter() - started
        numbers = summary(result, truth)
        rows.append((name, result, numbers))
        if document is not None:
            continue
        sens = sensitivity(resolved.schedule, inputs, truth, pool, resolved.serving, pairs=variant.sensitivity_pairs,
                           seed=variant.seed, step=variant.sensitivity_step,
                           workers=args.workers, transfer=resolved.transfer) if variant.sensitivity else None
        report = text_report(name, result, truth, sens)
        index = result.median_run()
        run, engine = one_run(resolved.schedule, inputs, truth, pool, resolved.serving, result.seeds[index],
                              result.factors[index], transfer=resolved.transfer)
        timeline = timeline_png(run, engine.timeline, engine.preempted, engine.model.blocks, out / "timeline.png",
                                f"{name}: the median-score run of {variant.runs} (seed {result.seeds[index]})")
        spread = distribution_png(numbers, out / "distribution.png", f"{name}: {variant.runs} simulated runs")
        (out / "report.txt").write_text(describe(variant, resolved, len(inputs)) + "\n" + pool.turn_model.summary()
                                        + "\n" + report + "\n")
        print(report)
        print(f"  ({variant.runs} runs simulated in {elapsed:.1f} s)")
        print(f"report: {out / 'report.txt'}\ntimeline plot: {timeline}\ndistribution plot: {spread}")
        document = (variant.to_json(), list(resolved.notes), numbers, sens)
        if args.compare_fifo:  # the same variant with second attempts first in, first out (same seeds: paired)
            fifo = forecast(replace(resolved.schedule, second_by_confidence=False), inputs, truth, pool,
                            resolved.serving, runs=variant.runs, seed=variant.seed,
                            throughput_noise=variant.throughput_noise, bootstraps=variant.bootstraps,
                            workers=args.workers, transfer=resolved.transfer)
            rows.append((f"{name} FIFO 2nd", fifo, summary(fifo, truth)))
    if len(rows) > 1:
        table = sweep_table(rows)
        (out / "sweep.txt").write_text(table + "\n")
        print(table)
    if args.json:
        body = report_json(document[0], document[1], document[2], document[3],
                           [(name, numbers) for name, _, numbers in rows[1:]])
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(body, indent=1) + "\n")
        print(f"json: {args.json}")
    return 0


def cmd_calibrate(args: argparse.Namespace) -> int:
    profile = load_profile(args.profile)
    kv = profile.engine.kv_cache_memory_bytes  # a pinned cache size in bytes is not a token count: ask for it
    result = fit(read_windows(args.stats), args.kv_tokens, profile.engine.max_num_seqs)
    text = to_toml(result.model, f"fitted by python -m sim calibrate on {args.stats} ({result.windows} windows, "
                                 f"mean token error {100 * result.token_error:.1f}%; "
                                 f"{engine_numbers.line(result.engine)})")
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
    serving = for_profile(_serving_for(args, args.profile), profile)
    runs = [("the serving model's step model", None)]
    if args.trace:
        runs.append((f"the measured trace of {args.trace}", trace_from_windows(read_windows(args.trace),
                                                                                str(args.trace))))
    for name, trace in runs:
        result = backtest(records, inputs, truth, profile.schedule, serving, trace, profile.selection.transfer)
        print(f"backtest of {args.log} on {name}: {result.matched} attempts matched")
        print(f"  start error  {result.start_error_s:8.1f} s (mean absolute)")
        print(f"  finish error {result.finish_error_s:8.1f} s")
        print(f"  attempts: logged {result.logged_attempts} finished + {result.logged_aborted} aborted, simulated "
              f"{result.simulated_attempts} finished + {result.simulated_aborted} aborted")
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
    f.add_argument("--scenario", type=Path, help="scenario TOML (sim/scenario.py); options below override it")
    f.add_argument("--profile", help="run profile (default moe-4xL4)")
    f.add_argument("--serving", help="serving model TOML (default sim/serving_models/PROFILE.toml)")
    f.add_argument("--kv-tokens", type=int, help="KV-cache size in tokens")
    f.add_argument("--throughput", type=float, help="aggregate decode tokens/s (at --throughput-running requests)")
    f.add_argument("--throughput-running", type=int, help="running requests the throughput is measured at")
    f.add_argument("--throughput-context", type=int, help="context tokens per running request there (30000)")
    f.add_argument("--startup-s", type=float, help="engine start-up seconds")
    f.add_argument("--hidden-tasks", type=int, help="tasks in the simulated set, made up beyond the labelled (240)")
    f.add_argument("--test-inputs", type=int, help="test inputs in the simulated set")
    f.add_argument("--inputs-per-task", help="made-up tasks' test-input counts, COUNT:WEIGHT,... (1:0.6,2:0.3,3:0.1)")
    for name in SCHEDULE_OPTIONS:
        f.add_argument(f"--{name.replace('_', '-')}", type=str if name == "repair_caps" else int,
                       help="schedule override" + (" (comma-separated)" if name == "repair_caps" else ""))
    f.add_argument("--throughput-noise", type=float, help="sigma of a per-run speed factor (0: off)")
    f.add_argument("--runs", type=int)
    f.add_argument("--bootstraps", type=int)
    f.add_argument("--seed", type=int)
    f.add_argument("--forced-accuracy", type=float)
    f.add_argument("--sensitivity", action="store_true")
    f.add_argument("--sensitivity-step", type=float, help="relative step of the paired runs (0.05)")
    f.add_argument("--sensitivity-pairs", type=int, help="paired runs per resource (20)")
    f.add_argument("--sweep", help="KEY=V1,V2 over a scenario or schedule field, or profiles P1,P2")
    f.add_argument("--compare-fifo", action="store_true",
                   help="also forecast the profile with second attempts first in, first out")
    f.add_argument("--out", default="out/simulate")
    f.add_argument("--json", type=Path, help="write the whole report as JSON here")
    f.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)),
                   help="processes the runs are spread over (default: the cores this process may use)")
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
    b.add_argument("--trace", type=Path, help="the run's <log>.stats.jsonl: also replay its measured step times")
    args = parser.parse_args(argv)
    try:
        return {"forecast": cmd_forecast, "calibrate": cmd_calibrate, "backtest": cmd_backtest}[args.command](args)
    except (LoadError, ProfileError, ValueError, OSError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
