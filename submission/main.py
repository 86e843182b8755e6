"""The solver's one entry: reads the profile and runs the line its `line` names.

    python -m submission.main --tasks PATH --out submission.json --profile NAME [--model DIR]
                              [--deadline SECONDS [--scale-schedule]] [--log attempts.jsonl] [--resume]
                              [--solutions PATH] [--max-tasks N] [--heartbeat PATH]

A profile without `line` runs the reasoning line (submission.reasoning.run: the schedule, the engine, the answer file,
the log, the watchdog, SIGTERM and `--resume` are described there); `line = "grid"` the grid line
(submission.grid.run, SPEC section 10: its own workers, the same answer file and log); `line = "both"` both lines,
each on its share of the GPUs, one merged answer file (submission.both.run). Every line's watchdog is disarmed when its
run returns; `main(argv, watchdog=False)` arms none. In-process callers (training.corpus's probe) call the library
function this entry calls, submission.lines.run_profile, with arguments built by submission.lines.arguments. A
profile, tasks or model the run cannot use is refused with exit status 2.
"""

from __future__ import annotations

import sys

from submission.reasoning.engines import make_engine
from submission.lines import entry_parser, run_profile
from submission.reasoning.run import NewEngine


def main(argv: list[str] | None = None, watchdog: bool = True, new_engine: NewEngine = make_engine) -> int:
    """`watchdog=False` for in-process callers that bound the run themselves; otherwise it is disarmed on return.
    `new_engine`: the reasoning line's engine maker (a test's fake engine comes in here). The run itself is
    submission.lines.run_profile, which in-process callers call directly."""
    return run_profile(entry_parser("python -m submission.main", __doc__).parse_args(argv), watchdog, new_engine)


if __name__ == "__main__":
    sys.exit(main())
