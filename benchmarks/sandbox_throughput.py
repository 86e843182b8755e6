"""Sandbox checks per second: the warm fork server against a fresh `python -I` subprocess per check, in one run.

    python benchmarks/sandbox_throughput.py [--checks 300] [--baseline-checks 30]

Workload: a trivial program (`return grid`) on five 30x30 grids (four demonstrations and one test input), the size of
a large ARC task. The baseline is the usual approach: start `python -I`, import numpy, exec the program, run it on the
grids, print JSON. Both run sequentially on one core's worth of work; the ratio is what RESULTS.md records.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from submission.grids import to_grid  # noqa: E402
from submission.sandbox.client import Sandbox  # noqa: E402
from submission.tasks import Pair, Task  # noqa: E402
from targets import Targets, spread  # noqa: E402

PROGRAM = "def transform(grid):\n    return grid\n"
BASELINE = """
import json, sys
import numpy
request = json.loads(sys.stdin.read())
namespace = {}
exec(request["program"], namespace)
print(json.dumps([namespace["transform"](g) for g in request["inputs"]]))
"""


def grids(n: int) -> list:
    rng = random.Random(0)
    return [to_grid([[rng.randrange(10) for _ in range(30)] for _ in range(30)]) for _ in range(n)]


def warm_server(checks: int) -> tuple[float, dict]:
    g = grids(5)
    task = Task("bench", tuple(Pair(x, x) for x in g[:4]), (g[4],), (g[4],))
    with Sandbox() as box:
        for _ in range(5):
            box.check(PROGRAM, task)  # warm-up
        start = time.perf_counter()
        for _ in range(checks):
            result = box.check(PROGRAM, task)
        elapsed = time.perf_counter() - start
        assert result.train_perfect
        return checks / elapsed, box.layers


def fresh_interpreter(checks: int) -> float:
    request = json.dumps({"program": PROGRAM, "inputs": [[list(r) for r in x] for x in grids(5)]})
    start = time.perf_counter()
    for _ in range(checks):
        subprocess.run([sys.executable, "-I", "-c", BASELINE], input=request, capture_output=True, text=True,
                       check=True, timeout=60)
    return checks / (time.perf_counter() - start)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checks", type=int, default=300)
    parser.add_argument("--baseline-checks", type=int, default=30)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds of both sides (medians reported)")
    args = parser.parse_args()
    baselines, warms, ratios = [], [], []
    for _ in range(args.repeats):  # interleaved: both sides see the same machine state
        baselines.append(fresh_interpreter(args.baseline_checks))
        warm, layers = warm_server(args.checks)
        warms.append(warm)
        ratios.append(warm / baselines[-1])
    print(f"layers: {layers}; medians (min-max) of {args.repeats} interleaved rounds")
    print(f"fresh python -I per check: {spread(baselines)} checks/s")
    print(f"warm fork server:          {spread(warms)} checks/s")
    print(f"ratio: {spread(ratios)}x")
    targets = Targets()
    targets.at_least("ratio (median)", statistics.median(ratios), 20, "x")
    targets.at_most("warm check (median)", 1000 / statistics.median(warms), 15, " ms")
    return targets.exit_code()


if __name__ == "__main__":
    sys.exit(main())
