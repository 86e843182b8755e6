"""Grids: the one value type every part of the kit passes around.

A grid is a tuple of equal-length tuples of ints 0..9, 1..30 on each side (SPEC section 1). Tuples, not lists, so
grids hash (voting counts them) and cannot be mutated behind a caller's back. JSON lists are converted at the edges.
"""

from __future__ import annotations

import re
from itertools import chain
from typing import Any

Grid = tuple[tuple[int, ...], ...]

MAX_SIDE = 30
COLOURS = 10
EMPTY_ANSWER: Grid = ((0,),)  # what an unanswered slot holds in the answer file


class GridError(ValueError):
    """A value that is not a valid grid; the message says what is wrong with it (not where: callers add that)."""


def _cell(value: Any) -> int:
    # bool is an int subclass but never a colour; numpy integers and integral floats (np.zeros defaults to float)
    # are accepted because programs legitimately produce them.
    if type(value).__name__ in ("bool", "bool_"):
        raise GridError(f"cell {value!r} is a boolean, not a colour")
    if isinstance(value, int) or hasattr(value, "__index__"):
        cell = int(value)
    elif isinstance(value, float) or type(value).__name__.startswith("float"):
        number = float(value)
        if not number.is_integer():
            raise GridError(f"cell {value!r} is not an integer")
        cell = int(number)
    else:
        raise GridError(f"cell {value!r} is a {type(value).__name__}, not an int")
    if not 0 <= cell < COLOURS:
        raise GridError(f"cell {cell} is outside 0..9")
    return cell


def to_grid(value: Any) -> Grid:
    """Validate a JSON-like or numpy value and return it as a Grid, or raise GridError saying what is wrong."""
    fast = _fast_grid(value)
    if fast is not None:
        return fast
    if hasattr(value, "tolist") and hasattr(value, "ndim"):  # numpy array: check dimensions before converting
        if value.ndim != 2:
            raise GridError(f"array has {value.ndim} dimensions, not 2")
        if value.size > MAX_SIDE * MAX_SIDE:
            raise GridError(f"array of shape {tuple(value.shape)} exceeds {MAX_SIDE}x{MAX_SIDE}")
        value = value.tolist()
    if not isinstance(value, (list, tuple)):
        raise GridError(f"grid is a {type(value).__name__}, not a list of rows")
    if not 1 <= len(value) <= MAX_SIDE:
        raise GridError(f"grid has {len(value)} rows, not 1..{MAX_SIDE}")
    rows = []
    width = None
    for r, row in enumerate(value):
        if hasattr(row, "tolist") and not isinstance(row, (list, tuple)):
            row = row.tolist()
        if not isinstance(row, (list, tuple)):
            raise GridError(f"row {r} is a {type(row).__name__}, not a list")
        if width is None:
            width = len(row)
            if not 1 <= width <= MAX_SIDE:
                raise GridError(f"row {r} has {width} cells, not 1..{MAX_SIDE}")
        elif len(row) != width:
            raise GridError(f"row {r} has {len(row)} cells, row 0 has {width} (ragged)")
        try:
            rows.append(tuple(_cell(v) for v in row))
        except GridError as err:
            raise GridError(f"row {r}: {err}") from None
    return tuple(rows)


def _fast_grid(value: Any) -> Grid | None:
    """The common case (plain lists of ints, or an int array) validated in one numpy pass; None means 'look closer'.

    Every sandbox check validates each output twice (child and caller), so this path is hot: ~10x faster than
    the cell-by-cell walk below, which stays the reference and produces the error messages."""
    # numpy here, not at the top: profiles import this module, and boot's preflight machine stage loads them under
    # Kaggle's bare Python before the wheels are installed (issue 27); once imported, this line is a dict lookup.
    import numpy as np

    if isinstance(value, list) and value and isinstance(value[0], list) and len(value) <= MAX_SIDE:
        try:
            array = np.array(value)
        except (ValueError, TypeError, OverflowError):  # ragged, or objects numpy refuses
            return None
        # bools would pass as 0/1 in an int array; map/chain/set keep this check in C (a generator over the cells was
        # a third of the caller's CPU per sandbox check, measured with cProfile, issue 20)
        if set(map(type, chain.from_iterable(value))) != {int}:
            return None
    elif isinstance(value, np.ndarray):
        array = value
    else:
        return None
    if (array.ndim != 2 or array.dtype.kind not in "iu" or not 1 <= array.shape[0] <= MAX_SIDE
            or not 1 <= array.shape[1] <= MAX_SIDE or array.min() < 0 or array.max() >= COLOURS):
        return None
    return tuple(map(tuple, array.tolist()))


# The sandbox's wire form of a grid: rows of digits joined by "/" ("01/23" is ((0, 1), (2, 3))). Parsing and writing
# it are single C calls (translate, split, a regular expression), where JSON's list of lists of ints cost ~0.1 ms per
# 30x30 grid at each of five steps of a check (caller, server, child, and back): about a third of a warm check.
_TO_DIGITS = bytes.maketrans(bytes(range(COLOURS)), b"0123456789")
_FROM_DIGITS = bytes.maketrans(b"0123456789", bytes(range(COLOURS)))
_CELLS = re.compile(rb"[0-9]{1,%d}(?:/[0-9]{1,%d}){0,%d}" % (MAX_SIDE, MAX_SIDE, MAX_SIDE - 1))


def to_cells(grid: Grid) -> str:
    """A valid grid in the sandbox's wire form: `to_cells(((0, 1), (2, 3))) == "01/23"`."""
    return b"/".join(map(bytes, grid)).translate(_TO_DIGITS).decode()


def from_cells(text: str) -> Grid:
    """The grid a wire-form string holds, or GridError: the text comes from a process that ran untrusted code, so it is
    checked (digits only, 1..30 rows of one width 1..30) before it becomes a grid."""
    raw = text.encode() if isinstance(text, str) else b""
    if not _CELLS.fullmatch(raw):
        raise GridError(f"malformed grid text {text!r:.60}")
    rows = raw.translate(_FROM_DIGITS).split(b"/")
    if len(set(map(len, rows))) != 1:
        raise GridError(f"rows of different widths in {text!r:.60}")
    return tuple(map(tuple, rows))


def to_json(grid: Grid) -> list[list[int]]:
    """The JSON form of a grid (lists of lists), as the answer file and the sandbox protocol carry it."""
    return [list(row) for row in grid]


def shape(grid: Grid) -> tuple[int, int]:
    return len(grid), len(grid[0])
