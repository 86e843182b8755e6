"""python benchmarks/corpus_admission.py [--sizes 1000,5000,20000] [--candidates 200] [--real 30]

Cost of admission's exact search as the corpus grows: for each corpus size, the seconds to judge one candidate
(8 conjugates against every admitted vector, 48 slots), as a ratio to the smallest size measured in the same run
(near-linear search means the ratio tracks the size ratio). Corpora are random behaviour vectors, since only their
count matters for the search; `--real` also times whole candidates (oracle on the probe bank x 8 conjugates + search)
on real programs. Prints peak memory (ru_maxrss).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.corpus import admission, dsl, scenes  # noqa: E402


def search_seconds(size: int, candidates: int, rng: np.random.Generator) -> float:
    n_slots = len(scenes.probe_bank())
    # a restored corpus: admitting one by one would itself be the quadratic cost being measured
    adm = admission.Admitter.restored([str(i) for i in range(size)], rng.integers(0, 1 << 62, (size, n_slots)))
    cands = rng.integers(0, 1 << 62, (candidates, 8, n_slots))
    start = time.perf_counter()
    for cand in cands:
        adm.judge(cand)
    return (time.perf_counter() - start) / candidates


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,5000,20000")
    parser.add_argument("--candidates", type=int, default=200)
    parser.add_argument("--real", type=int, default=30)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    sizes = [int(s) for s in args.sizes.split(",")]
    base = None
    print("| corpus | search per candidate | ratio to smallest | size ratio |")
    print("| --- | --- | --- | --- |")
    for size in sizes:
        sec = search_seconds(size, args.candidates, rng)
        base = base or (sec, size)
        print(f"| {size} | {sec * 1e3:.2f} ms | {sec / base[0]:.1f}x | {size / base[1]:.1f}x |")
    if args.real:
        probes = scenes.probe_bank()
        programs = dsl.all_programs()
        adm = admission.Admitter(len(probes))
        start = time.perf_counter()
        for i in rng.permutation(len(programs))[:args.real]:
            adm.consider(dsl.rule_id(programs[int(i)]), admission.behaviours(programs[int(i)], probes))
        sec = time.perf_counter() - start
        print(f"real candidates: {args.real / sec:.1f}/s ({adm.funnel['admitted'] / sec:.1f} admitted/s)")
    print(f"peak memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
