"""Both lines in one run: the reasoning line and the grid line on their shares of the GPUs, one merged answer file.

    python -m submission.both --tasks PATH --out submission.json --profile both-4xL4 [--deadline SECONDS]
                              [--reasoning-model DIR] [--grid-model DIR] [--reasoning-python PATH]
                              [--grid-python PATH] [--resume] [--solutions PATH] [--max-tasks N]
                              [--scale-schedule] [--heartbeat PATH]

The command line of the run in submission/both/run.py (the lines' processes, the merge, SIGTERM, `--resume` and the
heartbeat are described there). `python -m submission.main --profile both-4xL4` runs the same run with the profile's
models and this interpreter. A profile or tasks the run cannot use are refused with exit status 2.
"""

from __future__ import annotations

import argparse
import sys

from submission import cli
from submission.both.run import run
from submission.profiles import ProfileError, load_both_profile


def parser() -> argparse.ArgumentParser:
    p = cli.parser("python -m submission.both", __doc__, "both-tiny",
                   out_help="the merged answer file (submission.json)",
                   heartbeat_help="the run's heartbeat file for boot's supervisor (default: none)")
    p.add_argument("--reasoning-model", help="overrides reasoning.model")
    p.add_argument("--grid-model", help="overrides grid.model")
    p.add_argument("--reasoning-python", default=sys.executable, help="the reasoning line's interpreter")
    p.add_argument("--grid-python", default=sys.executable, help="the grid line's interpreter")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        both = load_both_profile(args.profile)
    except ProfileError as err:
        return cli.refuse(err)
    return run(args, both)


if __name__ == "__main__":
    sys.exit(main())
