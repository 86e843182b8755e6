"""Simulator speed: one 12-hour run of ~340 test inputs (240 tasks), and 1,000 forecast runs.

    python benchmarks/sim_speed.py [--runs 1000] [--workers N] [--arc-data DIR]

--arc-data defaults to $ARC_DATA, else ../shared/arc-data.

Targets (issues 4 and 16): one run under 1 second; 1,000 runs under 30 seconds as `python -m sim forecast` makes them,
on `--workers` processes (default, as the CLI's: every core this process may use); a tenth of them on one process is
timed too, for the per-core rate. The ratio printed is against the same work done with the scheduler alone on a
trivial engine (every request taking a fixed time), measured in the same run: the price of the serving model (its
paged KV cache included) and the attempt pool over the bare policy. A run on a quarter of the cache (1M tokens: the
cache full all run, ~1,300 preemptions) shows the worst case of the event solver. The serving model carries the
profile's token budget and draft tokens, as a forecast's does (sim.scenario.for_profile: chunked prefills and the
steps after admissions are taken one at a time); a run without them is timed too. The machine is shared: the load
average is printed with the times.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from sim.example_log import make_records  # noqa: E402
from sim.forecast import build_inputs, forecast, one_run  # noqa: E402
from sim.pool import AttemptPool  # noqa: E402

from sim.run import LatencyEngine, simulate  # noqa: E402
from sim.scenario import for_profile  # noqa: E402
from sim.serving import load_serving  # noqa: E402
from submission.profiles import load_profile  # noqa: E402
from submission.tasks import load_tasks  # noqa: E402
from targets import Targets  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=len(os.sched_getaffinity(0)))
    parser.add_argument("--arc-data", default=os.environ.get("ARC_DATA", str(REPO.parent / "shared" / "arc-data")))
    args = parser.parse_args()
    tasks = load_tasks(Path(args.arc_data) / "arc-agi-2" / "evaluation").tasks
    inputs, truth = build_inputs(tasks, {}, 240, random.Random(0))
    pool = AttemptPool(make_records(tasks), truth)
    profile = load_profile("moe-4xL4")
    schedule = profile.schedule
    unbudgeted = load_serving(REPO / "sim" / "serving_models" / "moe-4xL4.toml")
    serving = for_profile(unbudgeted, profile)

    start = time.perf_counter()
    result, _ = one_run(schedule, inputs, truth, pool, serving, seed=0)
    single = time.perf_counter() - start
    start = time.perf_counter()
    one_run(schedule, inputs, truth, pool, unbudgeted, seed=0)
    plain = time.perf_counter() - start
    start = time.perf_counter()
    bare = simulate(schedule, inputs, pool.draw, LatencyEngine(lambda job: job.tokens / 8.0), truth, 0)
    baseline = time.perf_counter() - start
    start = time.perf_counter()
    full, _ = one_run(schedule, inputs, truth, pool, replace(serving, kv_tokens=1_000_000), seed=0)
    crowded = time.perf_counter() - start
    start = time.perf_counter()
    forecast(schedule, inputs, truth, pool, serving, runs=max(args.runs // 10, 1), workers=1)
    per_core = (time.perf_counter() - start) / max(args.runs // 10, 1)
    start = time.perf_counter()
    forecast(schedule, inputs, truth, pool, serving, runs=args.runs, workers=args.workers)
    many = time.perf_counter() - start
    print(f"inputs: {len(inputs)}; attempts in one run: {len(result.finished)} (bare policy: {len(bare.finished)})")
    print(f"one 12-hour run:     {single * 1000:7.1f} ms")
    print(f"without the profile's token budget and drafts: {plain * 1000:7.1f} ms")
    print(f"bare policy run:     {baseline * 1000:7.1f} ms  (ratio {single / baseline:.2f}x)")
    print(f"1M-token cache run:  {crowded * 1000:7.1f} ms  ({full.preemptions} preemptions; ratio "
          f"{crowded / baseline:.2f}x the bare policy)")
    print(f"forecast runs on one process: {per_core * 1000:7.1f} ms each")
    print(f"{args.runs} forecast runs:  {many:7.2f} s on {args.workers} processes "
          f"(load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores)")
    targets = Targets()
    targets.at_most("one 12-hour run", single * 1000, 1000, " ms")
    targets.at_most(f"{args.runs} forecast runs", many * 1000 / args.runs, 30, " s per 1,000")
    return targets.exit_code()


if __name__ == "__main__":
    sys.exit(main())
