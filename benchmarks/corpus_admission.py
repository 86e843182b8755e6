"""python benchmarks/corpus_admission.py [--sizes 1000,5000,20000] [--candidates 200] [--real 30] [--gates 6]

Cost of admission's exact search as the corpus grows: for each corpus size, the seconds to judge one candidate
(8 conjugates against every admitted vector, one slot per probe of rules.probe_bank()), as a ratio to the smallest
size measured in the same run. Target: near-linear, i.e. the largest size's time ratio is at most 1.5x its size
ratio (exit 1 otherwise). Corpora are random behaviour vectors, since only their count matters for the search.
`--real` also times whole candidates (redundant-stage check, oracle on the bank x 8 conjugates, search) of all four
families in generate's order (rules admitted per second), and `--gates` times the task gate on that many admitted
rules (tasks proposed and judged per second, one core). Prints peak memory (ru_maxrss).
"""

from __future__ import annotations

import argparse
import resource
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from training.corpus import admission, gate, generate, rules  # noqa: E402


def search_seconds(size: int, candidates: int, rng: np.random.Generator) -> float:
    n_slots = len(rules.probe_bank())
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
    parser.add_argument("--gates", type=int, default=6)
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
    worst = sec / base[0] / (size / base[1])
    if args.real:
        probes = rules.probe_bank()
        adm = admission.Admitter(len(probes))
        admitted = []
        start = time.perf_counter()
        for program in generate.leaf_candidates(list(rules.FAMILIES), 0)[:args.real]:
            if admission.admit_program(adm, program, probes).reason == "admitted":
                admitted.append(program)
        sec = time.perf_counter() - start
        print(f"real candidates: {args.real / sec:.2f}/s, {len(admitted) / sec:.2f} rules admitted/s "
              f"({len(probes)} probes)")
        if args.gates:
            start, accepted, tried = time.perf_counter(), 0, 0
            for row, program in enumerate(admitted[:args.gates]):
                pairs = gate.make_task(program, np.random.default_rng(row), probes)
                accepted += gate.judge_task(program, pairs, probes).accepted
                tried += 1
            sec = time.perf_counter() - start
            print(f"gate: {tried / sec:.2f} tasks gated/s ({accepted} of {tried} accepted)")
    print(f"peak memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    print(f"search time ratio / size ratio at {sizes[-1]}: {worst:.2f} (target <= 1.5: "
          f"{'met' if worst <= 1.5 else 'missed'})")
    raise SystemExit(0 if worst <= 1.5 else 1)


if __name__ == "__main__":
    main()
