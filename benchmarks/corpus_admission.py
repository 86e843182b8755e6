"""python benchmarks/corpus_admission.py [--sizes 1000,10000,100000] [--candidates 200] [--templates 120] [--real 30]
[--gates 6]

Cost per admitted rule as the corpus grows (issue 32): for each corpus size, the seconds to judge a candidate and
to choose a rule's rivals (`nearest`), as a ratio to the smallest size measured in the same run (admitting a row
adds it to a dict per set of blocks, which does not depend on the size); with `--real`, the same plus the oracle
work per candidate measured on real rules (what a run spends per candidate at that size).
Target: flat, the largest size at most 1.5x the smallest: the whole cost per candidate with `--real` (the
default), the search alone without it (exit 1 otherwise). The search alone is printed either way: it is well under
a millisecond, where the shared VM's load moves it by 2x between runs. Beside it, the mean rows compared slot by slot
per candidate by the judge (admission's index) and by `nearest` (the rivals' index), and their ratio largest /
smallest size: the same cost without the noise (`Admitter.cost`; a candidate valid on fewer than 16 slots is refused
before any search and counts 0 rows; tests/test_corpus.py pins these figures).
The corpora are synthetic behaviour rows: each is the raw behaviour of one of `--templates` real single rules (all
four families, generate's order) with every valid slot replaced by a fresh output code with probability 0.3-0.9,
error slots kept. So the rows have the real error structure (a rule is valid on a fraction of the 1,188 slots; blocks
where many rules agree), which is what fills buckets; the candidates are drawn the same way.
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


def synthetic(templates: np.ndarray, count: int, rng: np.random.Generator) -> np.ndarray:
    """`count` rows, each a template with each valid slot redrawn with probability 0.3-0.9 (errors kept)."""
    rows = templates[rng.integers(len(templates), size=count)].copy()
    redraw = (rows >= 0) & (rng.random(rows.shape) < rng.uniform(0.3, 0.9, (count, 1)))
    rows[redraw] = rng.integers(0, 1 << 62, int(redraw.sum()))
    return rows


def seconds_per_rule(size: int, candidates: int, templates: np.ndarray, rng: np.random.Generator,
                     repeats: int = 5) -> tuple[float, float, float]:
    """Judge `candidates` new rules against a corpus of `size` rows and choose the rivals of as many admitted rows:
    the best of `repeats` passes (neither changes the corpus; the shared 2-core machine is noisy at this scale), and
    the mean rows compared per candidate by the judge and by `nearest` (the same in every pass)."""
    # a restored corpus: admitting one by one at every size would take the benchmark hours
    adm = admission.Admitter.restored([str(i) for i in range(size)], synthetic(templates, size, rng))
    cands = [np.array([row] * 8) for row in synthetic(templates, candidates, rng)]
    rows = rng.integers(size, size=candidates)
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for cand, row in zip(cands, rows):
            adm.judge(cand)
            adm.nearest(int(row), generate.NEAREST)
        best = min(best, time.perf_counter() - start)
    calls = repeats * candidates
    return best / candidates, adm.cost.judge_rows / calls, adm.cost.nearest_rows / calls


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="1000,10000,100000")
    parser.add_argument("--candidates", type=int, default=200)
    parser.add_argument("--templates", type=int, default=120)
    parser.add_argument("--real", type=int, default=30)
    parser.add_argument("--gates", type=int, default=6)
    args = parser.parse_args()
    rng = np.random.default_rng(0)
    probes = rules.probe_bank()
    templates = np.array([admission.raw_behaviour(p, probes)
                          for p in generate.leaf_candidates(list(rules.FAMILIES), 0)[:args.templates]])
    sizes = [int(s) for s in args.sizes.split(",")]
    base, seconds, compared = None, [], []
    print("| admitted rules | judge + rivals per rule | ratio to smallest | size ratio | rows compared: judge | "
          "nearest |")
    print("| --- | --- | --- | --- | --- | --- |")
    for size in sizes:
        sec, judge_rows, nearest_rows = seconds_per_rule(size, args.candidates, templates, rng)
        seconds.append(sec)
        compared.append((judge_rows, nearest_rows))
        base = base or (sec, size)
        print(f"| {size} | {sec * 1e3:.2f} ms | {sec / base[0]:.2f}x | {size / base[1]:.0f}x | {judge_rows:.3f} | "
              f"{nearest_rows:.1f} |")
    growth = [f"{name} {last / first:.2f}x" if first else f"{name} {first:.3f} -> {last:.3f}"
              for name, first, last in zip(("judge", "nearest"), compared[0], compared[-1])]
    print(f"rows compared per candidate at {sizes[-1]} / at {sizes[0]} (size {sizes[-1] / sizes[0]:.0f}x): "
          f"{', '.join(growth)}")
    search = {size: sec for size, sec in zip(sizes, seconds)}
    search_ratio = worst = search[sizes[-1]] / search[sizes[0]]
    if args.real:
        probes = rules.probe_bank()
        adm = admission.Admitter(len(probes))
        admitted = []
        start = time.perf_counter()
        for program in generate.leaf_candidates(list(rules.FAMILIES), 0)[:args.real]:
            if admission.admit_program(adm, program, probes).reason == "admitted":
                admitted.append(program)
        sec = time.perf_counter() - start
        measure = sec / args.real
        print(f"real candidates: {args.real / sec:.2f}/s, {len(admitted) / sec:.2f} rules admitted/s "
              f"({len(probes)} probes)")
        print("| admitted rules | admission per candidate (oracle + search) | ratio to smallest |")
        print("| --- | --- | --- |")
        for size in sizes:
            print(f"| {size} | {(measure + search[size]) * 1e3:.1f} ms | "
                  f"{(measure + search[size]) / (measure + search[sizes[0]]):.3f}x |")
        worst = (measure + search[sizes[-1]]) / (measure + search[sizes[0]])
        if args.gates:
            start, accepted, tried = time.perf_counter(), 0, 0
            for row, program in enumerate(admitted[:args.gates]):
                pairs = gate.make_task(program, np.random.default_rng(row), probes)
                accepted += gate.judge_task(program, pairs, probes).accepted
                tried += 1
            sec = time.perf_counter() - start
            print(f"gate: {tried / sec:.2f} tasks gated/s ({accepted} of {tried} accepted)")
    print(f"peak memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    print(f"search alone at {sizes[-1]} / at {sizes[0]}: {search_ratio:.2f}")
    print(f"{'admission per candidate' if args.real else 'search'} at {sizes[-1]} / at {sizes[0]}: {worst:.3f} "
          f"(target <= 1.5: {'met' if worst <= 1.5 else 'missed'})")
    raise SystemExit(0 if worst <= 1.5 else 1)


if __name__ == "__main__":
    main()
