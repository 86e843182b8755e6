"""python benchmarks/corpus_scaling.py [--rules 8] [--depth 2] [--tasks-per-rule 2] [--tries 2] [--workers 1,2]

Throughput of `training.corpus generate` on a local Ray (issue 32 section 1): the same run (all four families,
depth-2 composites, seed 0) on a fresh local Ray of 1 CPU, then of 2 CPUs, each into its own folder. Prints per
worker count the wall time of generate (Ray's start apart), the tasks written, tasks per core-hour (tasks / (wall x
workers)) and the speed-up against the 1-worker run of the same invocation; then the projected cost of a million
tasks at the measured per-core rate (core-hours, and days on this machine's two cores). The folders must be
byte-identical (same seed, same corpus whatever the number of workers). Target: identical, and a speed-up of at
least 1.3x on 2 workers (exit 1 otherwise; the VM is shared, so the figure moves with its load, printed).
Build environment (ray).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.corpus import cluster, generate  # noqa: E402

TARGET = 1.3


def files(root: Path) -> dict:
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rules", type=int, default=8)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--tasks-per-rule", type=int, default=2)
    parser.add_argument("--tries", type=int, default=2)
    parser.add_argument("--workers", default="1,2")
    args = parser.parse_args()
    print(f"load average at start: {os.getloadavg()[0]:.1f} ({os.cpu_count()} CPUs)")
    print("| workers | Ray start | generate | tasks | tasks per core-hour | speed-up |")
    print("| --- | --- | --- | --- | --- | --- |")
    results, made = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for workers in (int(w) for w in args.workers.split(",")):
            start = time.perf_counter()
            pool = cluster.RayPool(workers)
            started = time.perf_counter() - start
            out = Path(tmp) / f"w{workers}"
            start = time.perf_counter()
            counts = generate.generate(args.rules, args.tasks_per_rule, 0, out, tries=args.tries, depth=args.depth,
                                       pool=pool)
            wall = time.perf_counter() - start
            pool.close()
            tasks = counts["accepted"]
            results[workers] = (wall, tasks)
            made[workers] = files(out)
            base = results[min(results)]
            print(f"| {workers} | {started:.1f} s | {wall:.1f} s | {tasks} | {tasks / (wall * workers) * 3600:.0f} | "
                  f"{base[0] / wall:.2f}x |", flush=True)
    same = all(m == made[min(made)] for m in made.values())
    best = max(results)
    wall, tasks = results[best]
    rate = tasks / (wall * best) * 3600
    print(f"load average at end: {os.getloadavg()[0]:.1f}")
    print(f"a million tasks at {rate:.0f} tasks per core-hour: {1e6 / rate:,.0f} core-hours "
          f"({1e6 / rate / 2 / 24:,.0f} days on this machine's 2 cores, {1e6 / rate / 64 / 24:,.1f} days on 64)")
    speedup = results[min(results)][0] / wall
    print(f"same bytes with {', '.join(map(str, results))} workers: {same}; speed-up at {best} workers: "
          f"{speedup:.2f}x (target >= {TARGET}: {'met' if speedup >= TARGET and same else 'missed'})")
    raise SystemExit(0 if same and speedup >= TARGET else 1)


if __name__ == "__main__":
    main()
