"""How hard a corpus task is to infer, and whether its pairs show what the rule does (issue 32, section 4).

Pure functions of a rule and its pairs (keyed inputs, outputs); the gate (`gate.py`) and the curriculum
(`curriculum.py`) call them.

- `information(x, y)`: what one pair shows: the output cells that differ from the input's body (below the key row)
  when the shapes agree, else every output cell. A no-op pair (output == body) shows nothing.
- `weak_test_pair`: the test pair must be as informative as the demonstrations: not a no-op, not a 1x1 output
  when no demonstration's is, and no less informative than the least informative demonstration. Measured before:
  5 of 31 test outputs were 1x1 against 0 of 31 first pairs, because the test pair was the greedy picker's last,
  least informative choice.
- `invisible_stage`: every component and every neutralisable stage must change the output on >= MIN_SHOWN
  demonstrations (the test pair does not count: a solver never sees it), and on one of them by >= MIN_CELLS cells. A
  post operation whose whole effect is one changed cell, or that only the test pair shows, cannot be inferred (3 of
  10 sampled tasks before, e.g. keep+flip+fill+erase chains).
- `Difficulty`: composition depth, operation count and the leave-one-out pass rate of a cheap solver, the corpus's
  own DSL searched at a small budget (`search_order`), and the curriculum level they give (`level`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from training.corpus import compose, oracle, rules

MIN_SHOWN = 2  # demonstrations on which a stage must change the output (the gate's MIN_WRONG, on demonstrations)
MIN_CELLS = 2  # cells a stage must change on at least one demonstration
SEARCH_BUDGET = 300  # single rules the cheap solver tries, simplest first
# Curriculum levels (our own: seed 001's curriculum is not in ../shared/design/STUDY.md, see README):
# 0 the cheap search infers it on most folds; 1 one rule, at most 2 operations; 2 one rule, more operations;
# 3 a depth-2 composite; 4 deeper.
LEVELS = ("searchable", "single", "stacked", "composite", "deep")

Pair = tuple[np.ndarray, np.ndarray]


def _diff_cells(a: np.ndarray | None, b: np.ndarray | None) -> int:
    """Cells that differ between two outputs; a shape change or an error (None) counts every cell, and at least
    MIN_CELLS: a new shape shows the change whatever its size."""
    if a is None or b is None or a.shape != b.shape:
        return max(getattr(a, "size", 0), getattr(b, "size", 0), MIN_CELLS)
    return int((a != b).sum())


def information(x: np.ndarray, y: np.ndarray) -> int:
    """Cells of the output that the pair shows: those differing from the body of `x` (below its key row), or every
    output cell when the shapes differ.

    >>> x = np.array([[0, 3, 0], [0, 5, 5], [0, 0, 0]])
    >>> information(x, x[1:]), information(x, np.array([[5, 5, 0], [0, 0, 0]])), information(x, np.array([[3]]))
    (0, 2, 1)
    """
    body, y = np.asarray(x)[1:], np.asarray(y)
    return int((body != y).sum()) if body.shape == y.shape else int(y.size)


def is_no_op(x: np.ndarray, y: np.ndarray) -> bool:
    """The output is the input, or its body unchanged."""
    x, y = np.asarray(x), np.asarray(y)
    return any(a.shape == y.shape and np.array_equal(a, y) for a in (x, x[1:]))


def weak_test_pair(pairs: list[Pair]) -> str:
    """Why the last pair (the test) is less informative than the demonstrations, or "" when it is not."""
    demos, (x, y) = pairs[:-1], pairs[-1]
    if is_no_op(x, y):
        return "the test output is its input unchanged"
    if y.shape == (1, 1) and all(b.shape != (1, 1) for _, b in demos):
        return "the test output is 1x1 and no demonstration's is"
    least = min(information(a, b) for a, b in demos)
    if information(x, y) < least:
        return f"the test pair shows {information(x, y)} cells, every demonstration at least {least}"
    return ""


def _output(program, x: np.ndarray) -> np.ndarray | None:
    try:
        return rules.run(program, x)
    except oracle.OracleError:
        return None


def invisible_stage(program, demos: list[Pair]) -> str:
    """The first component or stage that the demonstrations do not show, as a sentence, or "" when all are shown."""
    for name, other in list(program.dropped()) + list(program.neutralised()):
        changed = [_diff_cells(_output(other, x), y) for x, y in demos]
        shown = sum(c > 0 for c in changed)
        if shown < MIN_SHOWN:
            return f"{name} changes {shown} demonstration outputs, fewer than {MIN_SHOWN}"
        if max(changed) < MIN_CELLS:
            return f"{name} changes at most {max(changed)} cell of a demonstration, fewer than {MIN_CELLS}"
    return ""


def operations(program) -> int:
    """One per single rule plus each stage that has a neutral form and is not neutral, the connectivity excepted
    (every object rule has one, so it would count the same for all).

    >>> from training.corpus.dsl import MaskOp, SelectMaskRender, Selector
    >>> operations(SelectMaskRender(Selector("size", "max"), MaskOp("keep", 0), ("flip_lr", "fill_holes"), "erase", 4))
    3
    """
    stages = [name for name, _ in program.neutralised() if not name.endswith("connectivity")]
    return compose.depth(program) + len(stages)


def search_order(budget: int = SEARCH_BUDGET) -> list:
    """The cheap solver's rules: every single rule of every family, fewest operations first, the families taken in
    turn within one operation count (each in its own order), the first `budget` of them."""
    ranked = [(operations(p), i, f, p) for f, family in enumerate(rules.FAMILIES)
              for i, p in enumerate(rules.all_programs(family))]
    return [p for *_, p in sorted(ranked, key=lambda t: t[:3])][:budget]


def solver_pass_rate(pairs: list[Pair], candidates: list) -> float:
    """Leave-one-out: with each pair held out in turn, the first candidate right on the other pairs predicts it; the
    share of the pairs predicted right. A candidate wrong on two pairs is dropped after those two runs."""
    right_on: list[set[int]] = []
    for program in candidates:
        right: set[int] = set()
        wrong = 0
        for i, (x, y) in enumerate(pairs):
            out = _output(program, x)
            if out is not None and out.shape == y.shape and np.array_equal(out, y):
                right.add(i)
            else:
                wrong += 1
                if wrong == 2:
                    break
        if wrong < 2:
            right_on.append(right)
    passed = 0
    for held in range(len(pairs)):
        fits = next((r for r in right_on if r >= set(range(len(pairs))) - {held}), None)
        passed += fits is not None and held in fits
    return passed / len(pairs)


@dataclass(frozen=True)
class Difficulty:
    depth: int
    operations: int
    solver_pass: float  # leave-one-out pass rate of the cheap search, in [0, 1]

    @property
    def level(self) -> int:
        """The curriculum level, an index into LEVELS."""
        if self.solver_pass >= 0.5:
            return 0
        if self.depth == 1:
            return 1 if self.operations <= 2 else 2
        return 3 if self.depth == 2 else 4

    def to_dict(self) -> dict:
        return {"depth": self.depth, "operations": self.operations, "solver_pass": round(self.solver_pass, 4),
                "level": self.level, "level_name": LEVELS[self.level]}


def measure(program, pairs: list[Pair], candidates: list) -> Difficulty:
    return Difficulty(compose.depth(program), operations(program), solver_pass_rate(pairs, candidates))


@dataclass(frozen=True)
class Filter:
    """Tasks a curriculum keeps: at most `max_level` and `max_operations`."""
    max_level: int = len(LEVELS) - 1
    max_operations: int = 5

    def beyond(self, difficulty: Difficulty) -> str:
        """Why a task is beyond the filter, or ""."""
        if difficulty.level > self.max_level:
            return f"level {difficulty.level} > {self.max_level}"
        if difficulty.operations > self.max_operations:
            return f"{difficulty.operations} operations > {self.max_operations}"
        return ""
