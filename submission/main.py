"""The solver's one entry: reads the profile and runs the line its `line` names.

    python -m submission.main --tasks PATH --out submission.json --profile NAME [--model DIR]
                              [--deadline SECONDS [--scale-schedule]] [--log attempts.jsonl] [--resume]
                              [--solutions PATH] [--max-tasks N] [--heartbeat PATH]

A profile without `line` runs the reasoning line (submission.reasoning: the schedule, the engine, the answer file,
the log, the watchdog, SIGTERM and `--resume` are described there); `line = "grid"` the grid line
(submission.grid.main, SPEC section 10: its own workers, the same answer file and log); `line = "both"` both lines,
each on its share of the GPUs, one merged answer file (submission.both). Every line's watchdog is disarmed when its
run returns; `main(argv, watchdog=False)` arms none, for in-process callers that bound the run themselves
(training.corpus probe). A profile, tasks or model the run cannot use is refused with exit status 2.
"""

from __future__ import annotations

import sys
from pathlib import Path

from submission import profiles
from submission.cli import parser, refuse
from submission.engines import make_engine
from submission.profiles import BothProfile, GridProfile, ProfileError
from submission.reasoning import NewEngine
from submission.reasoning import run as run_reasoning_line


def main(argv: list[str] | None = None, watchdog: bool = True, new_engine: NewEngine = make_engine) -> int:
    """`watchdog=False` for in-process callers that bound the run themselves; otherwise it is disarmed on return.
    `new_engine`: the reasoning line's engine maker (a test's fake engine comes in here)."""
    p = parser("python -m submission.main", __doc__, "cpu-tiny")
    p.add_argument("--model", help="checkpoint folder (or attempt log for the replay engine)")
    p.add_argument("--log", type=Path, help="attempt log (JSONL) to append to")
    args = p.parse_args(argv)
    try:
        profile = profiles.load(args.profile)
    except ProfileError as err:
        return refuse(err)
    if isinstance(profile, BothProfile):
        from submission.both import run as run_both_lines

        return run_both_lines(args, profile, watchdog)
    if isinstance(profile, GridProfile):
        from submission.grid.main import run as run_grid_line

        return run_grid_line(args, profile, watchdog)
    return run_reasoning_line(args, profile, new_engine, watchdog)


if __name__ == "__main__":
    sys.exit(main())
