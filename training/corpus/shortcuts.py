"""The task gate's 12 shortcut solvers: a task that one of them solves teaches nothing about its rule.

Each solver is a pure function (demonstrations, test input) -> candidate outputs (empty when it does not apply); it
fits on the five demonstrations only and solves the task when a candidate equals the test output. All but
`copy_demo` give at most one candidate; `copy_demo` offers every distinct demonstration output, which is what a
model that copies a demonstration could hit.
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import product

import numpy as np

from training.corpus.admission import dihedral

Pair = tuple[np.ndarray, np.ndarray]
Solver = Callable[[list[Pair], np.ndarray], list[np.ndarray]]


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.shape == b.shape and bool(np.array_equal(a, b))


def constant(train: list[Pair], x: np.ndarray) -> list[np.ndarray]:
    """Every demonstration has the same output: predict it."""
    first = train[0][1]
    return [first] if all(_same(y, first) for _, y in train) else []


def identity(train: list[Pair], x: np.ndarray) -> list[np.ndarray]:
    """Every output equals its input, or every output equals its input below the top row (the corpus's palette key
    row, which no output carries): predict the test input, or its body. Without the second form a task whose outputs
    are its bodies unchanged passed the gate (issue 32)."""
    if all(_same(a, b) for a, b in train):
        return [x]
    return [x[1:]] if all(_same(a[1:], b) for a, b in train) else []


def shape_lut(train: list[Pair], x: np.ndarray) -> list[np.ndarray]:
    """The output is a function of the input's shape alone (consistent on the demonstrations, shape seen)."""
    table: dict = {}
    for a, b in train:
        if a.shape in table and not _same(table[a.shape], b):
            return []
        table[a.shape] = b
    return [table[x.shape]] if x.shape in table else []


def _fit_lut(pairs: list[Pair]) -> dict | None:
    table: dict = {}
    for a, b in pairs:
        if a.shape != b.shape:
            return None
        for ca, cb in zip(a.ravel().tolist(), b.ravel().tolist()):
            if table.setdefault(ca, cb) != cb:
                return None
    return table


def _apply_lut(table: dict, x: np.ndarray) -> list[np.ndarray]:
    if not set(np.unique(x).tolist()) <= set(table):
        return []
    return [np.vectorize(table.__getitem__, otypes=[x.dtype])(x)]


def colour_lut(train: list[Pair], x: np.ndarray) -> list[np.ndarray]:
    """A fixed cell-wise colour map turns every input into its output."""
    table = _fit_lut(train)
    return [] if table is None else _apply_lut(table, x)


def _ranks(grid: np.ndarray) -> list[int] | None:
    """Colours from most to least frequent, or None on a frequency tie (the role would be ambiguous)."""
    colours, counts = np.unique(grid, return_counts=True)
    if len(set(counts.tolist())) != counts.size:
        return None
    return [int(c) for c in colours[np.argsort(-counts, kind="stable")]]


def colour_swap(train: list[Pair], x: np.ndarray) -> list[np.ndarray]:
    """One colour, named by its frequency rank, is replaced by another rank's colour (the same ranks every pair)."""
    ranks = [_ranks(a) for a, _ in train] + [_ranks(x)]
    if any(r is None for r in ranks):
        return []
    n = min(len(r) for r in ranks)
    for i, j in product(range(n), repeat=2):
        if i != j and all(_same(np.where(a == r[i], r[j], a), b) for (a, b), r in zip(train, ranks)):
            return [np.where(x == ranks[-1][i], ranks[-1][j], x)]
    return []


def dihedral_colour_map(train: list[Pair], x: np.ndarray) -> list[np.ndarray]:
    """A symmetry of the square followed by a fixed colour map (identity map included)."""
    for g in range(1, 8):
        table = _fit_lut([(dihedral(a, g), b) for a, b in train])
        if table is not None:
            return _apply_lut(table, dihedral(x, g))
    return []


def _crop(grid: np.ndarray) -> np.ndarray | None:
    ranks = _ranks(grid)
    if ranks is None or len(ranks) < 2:
        return None
    rows, cols = np.nonzero(grid != ranks[0])
    return grid[rows.min():rows.max() + 1, cols.min():cols.max() + 1]


def crop_foreground(train: list[Pair], x: np.ndarray) -> list[np.ndarray]:
    """Crop to the box of every cell that is not the most frequent colour."""
    if not all((c := _crop(a)) is not None and _same(c, b) for a, b in train):
        return []
    crop = _crop(x)
    return [] if crop is None else [crop]


def fixed_subgrid(train: list[Pair], x: np.ndarray) -> list[np.ndarray]:
    """The output is the input's window at one fixed position and size."""
    h, w = train[0][1].shape
    a0 = train[0][0]
    for r, c in product(range(a0.shape[0] - h + 1), range(a0.shape[1] - w + 1)):
        if all(a[r:r + h, c:c + w].shape == (h, w) and _same(a[r:r + h, c:c + w], b) for a, b in train):
            return [x[r:r + h, c:c + w]] if x[r:r + h, c:c + w].shape == (h, w) else []
    return []


def _line_select(train: list[Pair], x: np.ndarray) -> list[np.ndarray]:
    """Rows at fixed indices (counted from the top) form the output."""
    a0, b0 = train[0]
    if a0.shape[1] != b0.shape[1]:
        return []
    index = []
    for row in b0:
        hits = np.flatnonzero((a0 == row).all(axis=1))
        if hits.size == 0:
            return []
        index.append(int(hits[0]))
    if not all(max(index) < a.shape[0] and _same(a[index], b) for a, b in train) or max(index) >= x.shape[0]:
        return []
    return [x[index]]


def row_select(train: list[Pair], x: np.ndarray) -> list[np.ndarray]:
    """The output is a fixed selection of the input's rows."""
    return _line_select(train, x)


def column_select(train: list[Pair], x: np.ndarray) -> list[np.ndarray]:
    """The output is a fixed selection of the input's columns."""
    return [y.T for y in _line_select([(a.T, b.T) for a, b in train], x.T)]


def scale_tile(train: list[Pair], x: np.ndarray) -> list[np.ndarray]:
    """The output is the input scaled up (each cell a k x l block) or tiled k x l times, k, l in 1..4."""
    for k, l in product(range(1, 5), repeat=2):
        for op in (lambda a: np.kron(a, np.ones((k, l), dtype=a.dtype)), lambda a: np.tile(a, (k, l))):
            if (k, l) != (1, 1) and all(_same(op(a), b) for a, b in train):
                return [op(x)]
    return []


def copy_demo(train: list[Pair], x: np.ndarray) -> list[np.ndarray]:
    """Every distinct demonstration output."""
    out: list[np.ndarray] = []
    for _, b in train:
        if not any(_same(b, o) for o in out):
            out.append(b)
    return out


SOLVERS: dict[str, Solver] = {f.__name__: f for f in (
    constant, identity, shape_lut, colour_lut, colour_swap, dihedral_colour_map, crop_foreground, fixed_subgrid,
    row_select, column_select, scale_tile, copy_demo)}


def solved_by(train: list[Pair], test: Pair) -> list[str]:
    """Names of the shortcut solvers whose candidates include the test output."""
    x, y = test
    return [name for name, solver in SOLVERS.items() if any(_same(c, y) for c in solver(train, x))]
