"""The task gate (SPEC 11): a task for an admitted rule is kept only if its six pairs pin the rule down.

Checks, in order, each with its rejection reason:
  shape          five demonstrations + one test, distinct inputs, at least two output shapes;
  weak_test      the test pair is less informative than the demonstrations: a no-op, a 1x1 output when no
                 demonstration's is, or fewer cells shown than every demonstration (difficulty.weak_test_pair);
  replay         the oracle reproduces every pair exactly;
  immaterial     (composites) every component is material: the composite without it (`dropped()`) is wrong on
                 >= 2 pairs;
  stage          every typed stage that has a neutral form changes the output on >= 2 pairs when neutralised
                 (mask operator -> keep, each post operation -> dropped, connectivity -> the other one); the
                 selector and renderer have no neutral form and are identified by the not_separated check instead;
  invisible      each component and stage of the last two checks changes >= 2 demonstrations, one by >= 2 cells (the
                 test pair does not count: a solver never sees it; difficulty.invisible_stage);
  not_separated  each rival (up to 8 nearest admitted rules) and every one-node variant that behaves differently
                 on the probe bank (`distinct_variants`) is wrong on >= 2 pairs;
  shortcut       none of the 12 shortcut solvers solves it.
Programs with a stage that does nothing on the probe bank never reach the gate (admission's redundant_stage).
`judge_task` is pure (programs and arrays in, a report out); `make_task` draws the pairs from the scene generator.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from training.corpus import admission, difficulty, dsl, oracle, rules, shortcuts
from training.corpus.dsl import Program

N_PAIRS = 6
MIN_WRONG = 2
SHORTCUT_TRIES = 8  # test pairs make_task tries, best first, for one that no shortcut solver solves
REASONS = ("accepted", "shape", "weak_test", "replay", "immaterial", "stage", "invisible", "not_separated", "shortcut")

Pair = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class GateReport:
    reason: str  # one of REASONS
    detail: str = ""

    @property
    def accepted(self) -> bool:
        return self.reason == "accepted"


def _wrong_on(program: Program, pairs: list[Pair]) -> int:
    """On how many pairs `program` does not give the pair's output (an oracle error counts as wrong)."""
    wrong = 0
    for x, y in pairs:
        try:
            out = rules.run(program, x)
        except oracle.OracleError:
            wrong += 1
            continue
        wrong += not (out.shape == y.shape and np.array_equal(out, y))
    return wrong


def distinct_variants(program: Program, probes: tuple[np.ndarray, ...]) -> list[Program]:
    """One-node variants that admission would tell apart from `program` (raw behaviour differs on the probe bank).

    A variant with the same behaviour on every probe is, for the corpus, the same rule (bbox then fill_holes is just
    bbox): no task could separate them, so demanding it would reject every task of the rule. This is approximate:
    equal on the bank does not prove equal everywhere.
    """
    own = admission.raw_behaviour(program, probes)
    return [v for v in program.variants() if not np.array_equal(admission.raw_behaviour(v, probes), own)]


def judge_task(program: Program, pairs: list[Pair], probes: tuple[np.ndarray, ...],
               rivals: list[Program] = ()) -> GateReport:
    """The gate's verdict on a task: `pairs` are the 5 demonstrations then the test pair."""
    if len(pairs) != N_PAIRS:
        return GateReport("shape", f"{len(pairs)} pairs, need {N_PAIRS}")
    if len({(x.shape, x.tobytes()) for x, _ in pairs}) < N_PAIRS:
        return GateReport("shape", "two inputs are equal")
    if len({y.shape for _, y in pairs}) < 2:
        return GateReport("shape", "all outputs have one shape")
    weak = difficulty.weak_test_pair(pairs)
    if weak:
        return GateReport("weak_test", weak)
    if _wrong_on(program, pairs):
        return GateReport("replay", "the oracle does not reproduce every pair")
    for component, without in program.dropped():
        if _wrong_on(without, pairs) < MIN_WRONG:
            return GateReport("immaterial", f"dropping {component} changes fewer than {MIN_WRONG} outputs")
    for stage, ablated in program.neutralised():
        if _wrong_on(ablated, pairs) < MIN_WRONG:
            return GateReport("stage", f"{stage} changes fewer than {MIN_WRONG} outputs")
    hidden = difficulty.invisible_stage(program, pairs[:-1])
    if hidden:
        return GateReport("invisible", hidden)
    for rival in list(rivals) + distinct_variants(program, probes):
        if _wrong_on(rival, pairs) < MIN_WRONG:
            return GateReport("not_separated", f"{dsl.canonical_json(rival)} is wrong on fewer than {MIN_WRONG} pairs")
    solved = shortcuts.solved_by(pairs[:-1], pairs[-1])
    if solved:
        return GateReport("shortcut", ", ".join(solved))
    return GateReport("accepted")


def make_task(program: Program, rng: np.random.Generator, probes: tuple[np.ndarray, ...], rivals: list[Program] = (),
              pool: int = 80) -> list[Pair]:
    """Five demonstrations and a test pair with distinct inputs, from `pool` proposed scenes. The demonstrations are
    chosen greedily to separate the program from its dropped components, neutralised stages, rivals and one-node
    variants (each needs 2 wrong pairs); random scenes alone almost never do (measured: 0 of 40 tasks passed for four
    sample programs). The test pair is then the remaining scene that adds the most separation among those as
    informative as the demonstrations (`difficulty.weak_test_pair`), the most informative on a tie, and no shortcut
    solver's answer if one of the best SHORTCUT_TRIES is not; before, it was the greedy's last, least informative
    choice. The gate still judges the result on its own."""
    candidates: list[Pair] = []
    seen = set()
    for _ in range(pool):
        x, y = rules.propose(program, rng)
        if (x.shape, x.tobytes()) not in seen:
            seen.add((x.shape, x.tobytes()))
            candidates.append((x, y))
    others = ([p for _, p in program.dropped() + program.neutralised()] + list(rivals)
              + distinct_variants(program, probes))
    wrong = np.array([[_wrong_on(other, [pair]) for other in others] for pair in candidates], dtype=np.int32)
    chosen: list[int] = []
    covered = np.zeros(len(others), dtype=np.int32)
    while len(chosen) < min(N_PAIRS, len(candidates)):
        gain = (np.minimum(covered + wrong, MIN_WRONG) - np.minimum(covered, MIN_WRONG)).sum(axis=1)
        gain[chosen] = -1
        if len(chosen) == N_PAIRS - 1:  # the test pair: informative first, then separation, then cells shown
            demos = [candidates[i] for i in chosen]
            fit = np.array([not difficulty.weak_test_pair(demos + [pair]) for pair in candidates])
            shown = np.array([difficulty.information(*pair) for pair in candidates])
            order = [int(i) for i in np.lexsort((-np.arange(len(candidates)), shown, gain, fit))[::-1] if gain[i] >= 0]
            # fit, most gain, most cells, earliest scene; the first that no shortcut solves (else the first)
            best = next((i for i in order[:SHORTCUT_TRIES] if not shortcuts.solved_by(demos, candidates[i])), order[0])
        else:
            best = int(np.argmax(gain))  # ties go to the earliest scene: deterministic for a seed
        chosen.append(best)
        covered += wrong[best]
    return [candidates[i] for i in chosen]
