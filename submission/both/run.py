"""Both lines in one run (issue 18, item 8): some GPUs to the reasoning line, the others to the grid line, one answer
file chosen from both by `submission.merge`.

A library: submission.lines calls `run` for `python -m submission.main --profile both-4xL4` (with the profile's models
and this interpreter), submission/both/__main__.py for `python -m submission.both`, whose options add each line's model
and interpreter (the interpreters are options because on CPU the lines live in different environments, vLLM's and
PEFT's). A combined profile (`line = "both"`, e.g. profiles/both-4xL4.toml; submission.profiles.BothProfile) names each
line's own profile and gives each its share of the machine: the reasoning line's engine sees only `reasoning.devices`
(CUDA_VISIBLE_DEVICES; tensor parallelism `reasoning.tensor_parallel_size`), the grid line's workers run on
`grid.workers` among the GPUs `grid.devices` makes visible. Each line runs as it does alone, in its own process (its own
watchdog, deadline, log and answer file under OUT_DIR/reasoning and OUT_DIR/grid, `--resume` passed on); this process is
the one writer of `--out`: it re-reads both logs whenever one grows (every `poll_s`) and rewrites the merged answers,
atomically, so the answer file is complete and valid throughout. The lines' time limit is MERGE_S short of the run's, so
their shutdowns end before the last merge. A line that fails leaves the other's answers standing; a folder with an
earlier run's logs is refused unless `--resume`. SIGTERM is passed on to both lines (each ends with its answers so far);
after the last merge the run exits 143. `--scale-schedule` scales both lines' margins and caps to `--deadline` (the
commit run's rehearsal, submission/kaggle/boot.py). Off by default: only a `line = "both"` profile runs it. `--heartbeat
PATH`: at every poll this process writes one heartbeat for the whole run (submission/heartbeat.py `combine`: the most
advanced phase of the live lines, their counts summed), from each line's own heartbeat beside its log, so that boot's
supervisor watches a combined run as it watches one line.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from submission import cli
from submission.answer_file import AnswerFile, render_submission
from submission.attempts import read_log
from submission.heartbeat import HeartbeatError, HeartbeatWriter, path_for_log, read
from submission.merge import merge_logs
from submission.profiles import MERGE_S, BothProfile, ProfileError, line_profiles, load
from submission.tasks import LoadError, TaskSet

REPO = Path(__file__).resolve().parents[2]


def line_command(module: str, python: str, args: argparse.Namespace, folder: Path, deadline: float) -> list[str]:
    cmd = [python, "-m", module, "--tasks", str(args.tasks), "--out", str(folder / "submission.json"),
           "--profile", str(folder / "line-profile.toml"), "--log", str(folder / "attempts.jsonl"),
           "--deadline", f"{deadline:.1f}"]
    if args.max_tasks:
        cmd += ["--max-tasks", str(args.max_tasks)]
    if args.resume:
        cmd.append("--resume")
    return cmd


def run(args: argparse.Namespace, both: BothProfile, armed: bool = True) -> int:
    """The run of `both` for parsed arguments (submission.both's, or submission.main's, whose other flags must be
    unset);
    `armed`: whether the watchdog is (submission.cli.watchdog, disarmed when the run returns)."""
    started = time.monotonic()
    if getattr(args, "model", None) or getattr(args, "log", None):
        return cli.refuse("a combined run takes each line's model from its profile (or --reasoning-model, "
                          "--grid-model) and writes its logs under the answer file's folder (no --model, no --log)")
    try:
        if getattr(args, "reasoning_model", None):
            both = replace(both, reasoning=replace(both.reasoning, model=args.reasoning_model))
        if getattr(args, "grid_model", None):
            both = replace(both, grid=replace(both.grid, model=args.grid_model))
        limit = args.deadline or both.time_limit_s
        reasoning_toml, grid_toml = line_profiles(both, limit, bool(args.deadline)
                                                  and getattr(args, "scale_schedule", False))
        tasks = cli.run_tasks(args)
    except (ProfileError, LoadError, ValueError) as err:
        return cli.refuse(err)
    root = args.out.parent
    earlier = [root / n / "attempts.jsonl" for n in ("reasoning", "grid")]
    if not args.resume and any(log.exists() and log.stat().st_size for log in earlier):
        print(f"error: {root} holds the logs of an earlier run: pass --resume to continue it, or choose another "
              "--out folder", file=sys.stderr)
        return 2
    with cli.watchdog(limit, limit - 4.0, armed):  # the lines end MERGE_S earlier (module doc)
        return run_lines(args, both, tasks, limit, started, reasoning_toml, grid_toml)


def run_lines(args: argparse.Namespace, both: BothProfile, tasks: TaskSet, limit: float, started: float,
              reasoning_toml: str, grid_toml: str) -> int:
    """Both lines' processes, the merge at every poll, the exit status (the module doc)."""
    root = args.out.parent
    root.mkdir(parents=True, exist_ok=True)
    heartbeat = HeartbeatWriter(getattr(args, "heartbeat", None))
    heartbeat.beat("loading")
    answers = AnswerFile(args.out, tasks.test_counts())
    lines = {}
    pythons = {"reasoning": getattr(args, "reasoning_python", sys.executable),
               "grid": getattr(args, "grid_python", sys.executable)}
    for name, module, toml, share in (("reasoning", "submission.main", reasoning_toml, both.reasoning),
                                      ("grid", "submission.grid.main", grid_toml, both.grid)):
        folder = root / name
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "line-profile.toml").write_text(toml)
        env = dict(os.environ)
        if share.devices:
            env["CUDA_VISIBLE_DEVICES"] = share.devices
        cmd = line_command(module, pythons[name], args, folder, limit - MERGE_S - (time.monotonic() - started))
        lines[name] = (folder / "attempts.jsonl", subprocess.Popen(cmd, cwd=REPO, env=env))
    stopping: list[str] = []
    transfer = load(root / "reasoning" / "line-profile.toml").selection.transfer  # the reasoning line's selection

    def on_sigterm(*_) -> None:
        stopping.append("SIGTERM")
        for _, process in lines.values():
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)

    previous = forward_sigterm(on_sigterm)
    sizes: dict[str, int] = {}
    try:
        while True:
            running = any(process.poll() is None for _, process in lines.values())
            grown = {name: log.stat().st_size for name, (log, _) in lines.items() if log.exists()}
            if grown != sizes:  # read after the poll: once both lines have exited, their logs are read whole
                sizes = grown
                merged = merge_logs(tasks.test_counts(), *(read_log(lines[n][0]) if n in grown else []
                                                           for n in ("reasoning", "grid")), transfer=transfer)
                if any([answers.set(task_id, index, pair) for (task_id, index), pair in merged.items()]):
                    answers.write()
            if not running:
                break
            heartbeat.beat_combined(line_beats(lines))
            time.sleep(both.poll_s)
    finally:
        for name, (_, process) in lines.items():
            if process.poll() is None:
                process.terminate()
        for name, (_, process) in lines.items():
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if previous is not None:
            signal.signal(signal.SIGTERM, previous)
        heartbeat.beat("done")
    codes = {name: process.returncode for name, (_, process) in lines.items()}
    print(f"combined run ({both.name}): reasoning line exit {codes['reasoning']}, grid line exit {codes['grid']}; "
          f"time used: {time.monotonic() - started:.0f} s")
    labels = {t.id: t.test_outputs for t in tasks.tasks if t.test_outputs is not None}
    if labels:
        for name, path in (("reasoning line", root / "reasoning" / "submission.json"),
                           ("grid line", root / "grid" / "submission.json"), ("both", args.out)):
            print(cli.score_line(load_answers(path, answers.test_counts), labels, name))
    if stopping:  # a line already past its own handler (shutting down after its last task) dies of the signal
        return 143 if all(code in (0, 128 + signal.SIGTERM, -signal.SIGTERM) for code in codes.values()) else 1
    return 0 if all(code == 0 for code in codes.values()) else 1


def line_beats(lines: dict[str, tuple[Path, subprocess.Popen]]) -> list:
    """The heartbeats of the lines still running, each written by that line's process (an earlier run's file, or
    one being rewritten in place, is skipped)."""
    beats = []
    for log, process in lines.values():
        try:
            beat = read(path_for_log(log))
        except (OSError, HeartbeatError):
            continue
        if process.poll() is None and beat.pid == process.pid:
            beats.append(beat)
    return beats


def forward_sigterm(handler):
    """Install `handler` for SIGTERM (the notebook's rehearsal sends it once both logs have an attempt per task: it
    is passed on to both lines, which end with their answers so far, and the run merges once more and exits 143, as
    one line does); the handler it replaces, None where signals cannot be set (not the main thread)."""
    try:
        return signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread (an in-process caller): SIGTERM keeps its default
        return None


def load_answers(path: Path, test_counts: dict[str, int]) -> dict:
    """An answer file as written (a line that never wrote one: every slot [[0]])."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return render_submission(test_counts, {})
