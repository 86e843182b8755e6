"""The grid line's solver: workers on a shared queue, answers rewritten after every task (SPEC section 10).

    python -m submission.grid.main --tasks PATH --out submission.json --profile grid-tiny [--model DIR]
                                   [--adapter DIR [--merge]]
                                   [--deadline SECONDS [--scale-schedule]] [--log attempts.jsonl] [--resume]
                                   [--solutions PATH] [--max-tasks N] [--heartbeat PATH]

The command line of the run in submission/grid/run.py (its answer file, log, watchdog, SIGTERM, `--resume` and
heartbeat are described there). `python -m submission.main` with a grid-line profile (one with `line = "grid"`) runs
the same run without the grid-only flags (`--format`, `--adapter`, `--merge`); a combined run (submission.both) starts
its grid line with this command. A profile, tasks or model the run cannot use is refused with exit status 2.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from submission import cli
from submission.grid.format import LAYOUTS
from submission.grid.run import run
from submission.profiles import ProfileError, load_grid_profile


def parser() -> argparse.ArgumentParser:
    p = cli.parser("python -m submission.grid.main", __doc__, "grid-tiny")
    p.add_argument("--model", help="grid checkpoint folder (build.models.grid_vocab's output)")
    p.add_argument("--format", choices=sorted(LAYOUTS), help="the checkpoint's grid format (overrides model.format)")
    p.add_argument("--adapter", help="a PEFT adapter folder loaded on the model per worker (training.grid_tune's "
                   "out/adapter; relative to the working directory); each task's training starts from its weights")
    p.add_argument("--merge", action="store_true",
                   help="merge --adapter into the model instead (a fresh LoRA per task)")
    p.add_argument("--log", type=Path, help="attempt log (JSONL) to append to")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        profile = load_grid_profile(args.profile)
    except ProfileError as err:
        return cli.refuse(err)
    return run(args, profile)


if __name__ == "__main__":
    sys.exit(main())
