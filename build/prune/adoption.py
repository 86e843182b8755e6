"""The adoption rule for a smaller expert list (SPEC section 7): adopt only if it costs under a point and is faster.

    python -m build.prune.adoption --reference ref.json --candidate cand.json [--throughput-ratio 1.08]

Inputs are per-task correctness of the two arms on the same inputs and seeds (`{task_id: fraction right}` JSON, or
attempt logs scored the same way). The accuracy difference (candidate - reference, points) gets a one-sided 97.5%
lower bound by resampling tasks (paired bootstrap); the list is adopted when that bound is above -1 point and the
candidate's throughput is at least 5% higher.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np


@dataclass(frozen=True)
class Verdict:
    difference: float  # candidate - reference, points
    lower_bound: float  # one-sided 97.5% bootstrap lower bound, points
    throughput_ratio: float
    adopt: bool
    reason: str


def adoption(reference: dict[str, float], candidate: dict[str, float], throughput_ratio: float,
             max_loss: float = 1.0, min_speedup: float = 1.05, bootstraps: int = 10_000, seed: int = 0) -> Verdict:
    tasks = sorted(reference)
    if sorted(candidate) != tasks:
        missing = sorted(set(reference) ^ set(candidate))
        raise ValueError(f"the arms must cover the same tasks; differing: {missing[:5]}")
    diff = np.array([candidate[t] - reference[t] for t in tasks]) * 100
    rng = np.random.default_rng(seed)
    means = diff[rng.integers(0, len(diff), size=(bootstraps, len(diff)))].mean(1)
    lower = float(np.quantile(means, 0.025))
    ok_accuracy, ok_speed = lower > -max_loss, throughput_ratio >= min_speedup
    reason = (f"lower bound {lower:+.2f} points {'>' if ok_accuracy else '<='} -{max_loss}; throughput "
              f"x{throughput_ratio:.3f} {'>=' if ok_speed else '<'} x{min_speedup}")
    return Verdict(float(diff.mean()), lower, throughput_ratio, ok_accuracy and ok_speed, reason)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m build.prune.adoption", description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", required=True, type=Path)
    parser.add_argument("--candidate", required=True, type=Path)
    parser.add_argument("--throughput-ratio", required=True, type=float, help="candidate tokens/s over reference")
    args = parser.parse_args(argv)
    try:
        verdict = adoption(json.loads(args.reference.read_text()), json.loads(args.candidate.read_text()),
                           args.throughput_ratio)
    except (OSError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"difference {verdict.difference:+.2f} points; {verdict.reason}; "
          f"verdict: {'ADOPT' if verdict.adopt else 'keep the reference'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
