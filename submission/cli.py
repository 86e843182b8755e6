"""What the solver's three entry points (submission.main, submission.grid.main, submission.both) and the runs they
call (submission/reasoning/run.py, submission/grid/run.py, submission/both/run.py) share: their common arguments,
`--deadline`, the tasks with `--max-tasks`, the refusal of an old log, the heartbeat's path, the score printout and the
watchdog. Part of submission's core: it imports no run and no entry."""

from __future__ import annotations

import argparse
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

from submission.heartbeat import path_for_log
from submission.processes import kill_descendants
from submission.score import score
from submission.tasks import TaskSet, load_tasks


def parser(prog: str, doc: str, default_profile: str, out_help: str = "the answer file (submission.json)",
           heartbeat_help: str = "the heartbeat file for boot's supervisor (default: beside --log, "
                                 "attempts.heartbeat.json)") -> argparse.ArgumentParser:
    """An entry's parser with the arguments every entry takes; the entry adds its own."""
    p = argparse.ArgumentParser(prog=prog, description=doc.split("\n\n")[0])
    p.add_argument("--tasks", required=True, type=Path, help="task directory, task file or Kaggle challenges")
    p.add_argument("--out", required=True, type=Path, help=out_help)
    p.add_argument("--profile", default=default_profile, help="profile name (profiles/NAME.toml) or TOML path")
    p.add_argument("--deadline", type=float, help="time limit in seconds from now")
    p.add_argument("--scale-schedule", action="store_true",
                   help="scale the margins and caps to --deadline (the commit run's rehearsal)")
    p.add_argument("--resume", action="store_true", help="continue from the log without redoing finished work")
    p.add_argument("--solutions", type=Path, help="labels, to print the score at the end")
    p.add_argument("--max-tasks", type=int, help="only the first N tasks by id (demos)")
    p.add_argument("--heartbeat", type=Path, help=heartbeat_help)
    return p


def with_deadline(timing: Any, args: argparse.Namespace) -> Any:
    """A line's timing (ScheduleConfig or RunConfig) with `--deadline` as its time limit; `--scale-schedule` scales
    its margins and caps to it as well (`scaled`: the commit run's rehearsal)."""
    if not args.deadline:
        return timing
    return timing.scaled(args.deadline) if getattr(args, "scale_schedule", False) else replace(
        timing, time_limit_s=args.deadline)


def run_tasks(args: argparse.Namespace) -> TaskSet:
    """The run's tasks: `--tasks` (with `--solutions`), cut to `--max-tasks`; LoadError or ValueError: `refuse`."""
    tasks = load_tasks(args.tasks, args.solutions)
    return tasks.first(args.max_tasks) if args.max_tasks else tasks


def refuse(err: Exception | str) -> int:
    """An entry's refusal of its arguments (a profile, tasks, a model it cannot use): said, exit status 2."""
    print(f"error: {err}", file=sys.stderr)
    return 2


def refuse_old_log(args: argparse.Namespace) -> bool:
    """True (and says why) when `--log` holds an earlier run's records and `--resume` is not given: a new run never
    appends to an old log, whose records it would then take for its own."""
    if args.log and args.log.exists() and args.log.stat().st_size and not args.resume:
        print(f"error: --log {args.log} already holds records of an earlier run: pass --resume to continue it, or "
              "choose another --log (a new run never appends to an old log)", file=sys.stderr)
        return True
    return False


def heartbeat_path(args: argparse.Namespace) -> Path | None:
    """`--heartbeat`, or beside `--log` (attempts.heartbeat.json); None without either."""
    if getattr(args, "heartbeat", None):
        return Path(args.heartbeat)
    return path_for_log(args.log) if getattr(args, "log", None) else None


def go_offline() -> None:
    """The competition box has no network: libraries must never wait on a hub or send usage statistics."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"):
        os.environ.setdefault(name, "1")


def score_line(answers: dict, labels: dict, name: str = "") -> str:
    """The printed score of an answer file (submission.score's two weightings)."""
    report = score(answers, labels)
    return (f"score{f' ({name})' if name else ''}: task-weighted {report.task_weighted:.2f}, "
            f"input-weighted {report.input_weighted:.2f}")


def _expire() -> None:
    """The deadline came with the run stuck: end what the run started (tests/test_watchdog.py), then exit."""
    print("watchdog: deadline reached, exiting", file=sys.stderr, flush=True)
    kill_descendants()
    os._exit(0)


@contextmanager
def watchdog(time_limit_s: float, hard_stop_s: float, armed: bool = True) -> Iterator[None]:
    """Exit between the hard stop and the limit even if the run is stuck (the answer file is always current);
    SIGALRM's default action kills the process one second before the limit if even that fails. Armed on enter,
    disarmed on exit (however the block ends), so it never ends an in-process caller after the run; `armed=False`
    (`main(..., watchdog=False)`: callers that bound the run themselves, training.corpus probe) arms nothing."""
    if not armed:
        yield
        return
    exit_at = hard_stop_s + (time_limit_s - hard_stop_s) / 2
    timer = threading.Timer(exit_at, _expire)
    timer.daemon = True
    timer.start()
    previous = signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(max(int(time_limit_s - 1), 1))
    try:
        yield
    finally:
        timer.cancel()
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)
