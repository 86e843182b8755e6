"""The solver as a library: a profile's run on parsed arguments, by the line its `line` names.

`submission.main` parses its command line and calls `run_profile`; an in-process caller (training.corpus.probe)
builds the same arguments with `arguments` and calls it too, so no library goes through the command line's argument
list. A profile without `line` runs the reasoning line (submission.reasoning.run); `line = "grid"` the grid line
(submission.grid.run); `line = "both"` both lines (submission.both.run). `watchdog=False` arms no watchdog, for
callers that bound the run themselves; otherwise it is disarmed when the run returns. A profile the run cannot use is
refused with status 2.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from submission import profiles
from submission.cli import parser, refuse
from submission.reasoning.engines import make_engine
from submission.profiles import BothProfile, GridProfile, ProfileError
from submission.reasoning.run import NewEngine
from submission.reasoning.run import run as run_reasoning_line


def entry_parser(prog: str, doc: str) -> argparse.ArgumentParser:
    """submission.main's parser: every entry's common arguments, `--model` and `--log`."""
    p = parser(prog, doc, "cpu-tiny")
    p.add_argument("--model", help="checkpoint folder (or attempt log for the replay engine)")
    p.add_argument("--log", type=Path, help="attempt log (JSONL) to append to")
    return p


def arguments(tasks: Path, out: Path, profile: str = "cpu-tiny", *, model: str | None = None,
              log: Path | None = None, deadline: float | None = None, scale_schedule: bool = False,
              solutions: Path | None = None, max_tasks: int | None = None, resume: bool = False,
              heartbeat: Path | None = None) -> argparse.Namespace:
    """The arguments `entry_parser` would give for these options (tests/test_corpus_probe.py checks they match)."""
    return argparse.Namespace(tasks=tasks, out=out, profile=profile, model=model, log=log, deadline=deadline,
                              scale_schedule=scale_schedule, solutions=solutions, max_tasks=max_tasks, resume=resume,
                              heartbeat=heartbeat)


def run_profile(args: argparse.Namespace, watchdog: bool = True, new_engine: NewEngine = make_engine) -> int:
    """Load `args.profile` and run its line; `new_engine`: the reasoning line's engine maker (a test's fake engine
    comes in here)."""
    try:
        profile = profiles.load(args.profile)
    except ProfileError as err:
        return refuse(err)
    if isinstance(profile, BothProfile):
        from submission.both.run import run as run_both_lines

        return run_both_lines(args, profile, watchdog)
    if isinstance(profile, GridProfile):
        from submission.grid.run import run as run_grid_line

        return run_grid_line(args, profile, watchdog)
    return run_reasoning_line(args, profile, new_engine, watchdog)
