"""The task gate's 12 shortcut solvers: each one solves a task built for it, so the gate is not vacuous."""

from __future__ import annotations

import numpy as np
import pytest

from training.corpus import shortcuts

RNG_SEED = 11


def _grid(rng, h=5, w=6, colours=10):
    return rng.integers(0, colours, (h, w)).astype(np.int8)


def _task(rng, make_input, rule):
    pairs = []
    for _ in range(6):
        x = make_input(rng)
        pairs.append((x, rule(x).astype(np.int8)))
    return pairs[:5], pairs[5]


def _ranked(rng):
    """Three fresh colours with distinct counts 14 / 7 / 3 (a palette redrawn per pair)."""
    c = rng.choice(10, 3, replace=False)
    return rng.permutation(np.repeat(c, [14, 7, 3])).reshape(4, 6).astype(np.int8)


def _object(rng):
    bg, fg = rng.choice(10, 2, replace=False)
    g = np.full((7, 7), bg, np.int8)
    r, c = rng.integers(0, 4, 2)
    g[r:r + 3, c:c + 2] = fg
    g[r, c] = bg if rng.random() < 0.5 else fg
    return g


PERM = np.array([3, 7, 1, 0, 9, 2, 8, 5, 4, 6], dtype=np.int8)
FIXED = np.arange(6, dtype=np.int8).reshape(2, 3)


def _built(name: str, rng):
    if name == "constant":
        return _task(rng, _grid, lambda x: FIXED)
    if name == "identity":
        return _task(rng, _grid, lambda x: x)
    if name == "shape_lut":
        shapes = [(3, 4), (5, 2), (3, 4), (5, 2), (4, 4), (3, 4)]
        table = {s: _grid(rng, 2, 2) for s in set(shapes)}
        pairs = [(x := _grid(rng, *s), table[x.shape]) for s in shapes]
        return pairs[:5], pairs[5]
    if name == "colour_lut":
        return _task(rng, _grid, lambda x: PERM[x])
    if name == "colour_swap":
        def swap(x):
            colours, counts = np.unique(x, return_counts=True)
            least, most = colours[np.argmin(counts)], colours[np.argmax(counts)]
            return np.where(x == least, most, x)
        return _task(rng, _ranked, swap)
    if name == "dihedral_colour_map":
        return _task(rng, _grid, lambda x: PERM[np.rot90(x)])
    if name == "crop_foreground":
        def crop(x):
            rows, cols = np.nonzero(x != np.bincount(x.ravel()).argmax())
            return x[rows.min():rows.max() + 1, cols.min():cols.max() + 1]
        return _task(rng, _object, crop)
    if name == "fixed_subgrid":
        return _task(rng, _grid, lambda x: x[1:3, 2:5])
    if name == "row_select":
        return _task(rng, _grid, lambda x: x[[0, 2, 4]])
    if name == "column_select":
        return _task(rng, _grid, lambda x: x[:, [5, 1]])
    if name == "scale_tile":
        return _task(rng, lambda r: _grid(r, 3, 3), lambda x: np.kron(x, np.ones((2, 3), np.int8)))
    if name == "copy_demo":
        train, (x, _) = _task(rng, _grid, lambda x: _grid(rng, 3, 3))
        return train, (x, train[2][1])
    raise AssertionError(name)


def test_there_are_twelve_shortcut_solvers():
    assert len(shortcuts.SOLVERS) == 12


@pytest.mark.parametrize("name", list(shortcuts.SOLVERS))
def test_each_shortcut_solver_solves_a_task_built_for_it(name):
    train, test = _built(name, np.random.default_rng(RNG_SEED))
    assert name in shortcuts.solved_by(train, test)


# Solvers that generalise another also solve its task, and only those: a constant output is a shape look-up and a
# copied demonstration; identity is the identity colour map and the full window, all rows, all columns.
ALSO = {"constant": {"shape_lut", "copy_demo"}, "identity": {"colour_lut", "fixed_subgrid", "row_select",
                                                              "column_select"}, "shape_lut": {"copy_demo"}}


@pytest.mark.parametrize("name", list(shortcuts.SOLVERS))
def test_no_other_solver_solves_a_built_task(name):
    train, test = _built(name, np.random.default_rng(RNG_SEED))
    assert set(shortcuts.solved_by(train, test)) == {name} | ALSO.get(name, set())


def test_a_task_with_unrelated_outputs_is_solved_by_none():
    rng = np.random.default_rng(5)
    train, test = _task(rng, _grid, lambda x: _grid(rng, 4, 4))
    assert shortcuts.solved_by(train, test) == []
