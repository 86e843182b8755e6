"""The exact NumPy oracle for select-mask-render programs (and the error types of every family's oracle).

A grid is a 2-D integer array. Its palette key is the top row: cell (0, 0) is the background colour, cell (0, 1) the
mark colour, the rest of the row is background; the body is every row below. Nothing here guesses: a selector tie,
a missing key, a body without objects, or a mask that an operator empties raises an OracleError subclass, and the
error type is what admission records for that probe slot.
"""

from __future__ import annotations

from functools import lru_cache

import numpy as np

from training.corpus.dsl import Program


class OracleError(Exception):
    """The program has no single right output on this input."""


class BadKey(OracleError):
    """The top row is not a palette key (too small, mark == background, or other colours in the key row)."""


class NoObjects(OracleError):
    """The body has no non-background cell."""


class Ambiguous(OracleError):
    """Two or more components share the selected extreme value."""


class EmptyMask(OracleError):
    """A mask operator or post operation left no cell."""


class TooLarge(OracleError):
    """The output would exceed ARC's 30 x 30 (for example, more than 30 counted objects in a row)."""


class Asymmetric(OracleError):
    """A repaired template is not symmetric under the program's symmetry (the input is not of that template)."""


class Unjoinable(OracleError):
    """A PARALLEL composite's two outputs do not fit side by side (unequal heights) or stacked (unequal widths)."""


# append only: the index is the error code
ERRORS = (BadKey, NoObjects, Ambiguous, EmptyMask, TooLarge, Asymmetric, Unjoinable)


def parse_key(grid: np.ndarray) -> tuple[int, int, np.ndarray]:
    """Split a grid into (background, mark, body).

    >>> parse_key(np.array([[0, 3, 0], [0, 5, 5]]))
    (0, 3, array([[0, 5, 5]]))
    """
    if grid.ndim != 2 or grid.shape[0] < 2 or grid.shape[1] < 2:
        raise BadKey(f"grid of shape {grid.shape} has no room for a key and a body")
    bg, mark = int(grid[0, 0]), int(grid[0, 1])
    if mark == bg or (grid[0, 2:] != bg).any():
        raise BadKey("the top row is not [background, mark, background...]")
    return bg, mark, grid[1:]


def _neighbours(mask: np.ndarray, connectivity: int) -> np.ndarray:
    """Cells adjacent (by `connectivity`) to a True cell, or True themselves: one dilation step."""
    out = mask.copy()
    out[1:] |= mask[:-1]
    out[:-1] |= mask[1:]
    out[:, 1:] |= mask[:, :-1]
    out[:, :-1] |= mask[:, 1:]
    if connectivity == 8:
        out[1:, 1:] |= mask[:-1, :-1]
        out[1:, :-1] |= mask[:-1, 1:]
        out[:-1, 1:] |= mask[1:, :-1]
        out[:-1, :-1] |= mask[1:, 1:]
    return out


_SHIFTS = {4: ((1, 0), (-1, 0), (0, 1), (0, -1)),
           8: ((1, 0), (-1, 0), (0, 1), (0, -1), (1, 1), (1, -1), (-1, 1), (-1, -1))}


def label(cells: np.ndarray, connectivity: int) -> np.ndarray:
    """Each True cell's component, named by the flat index of the component's first cell in reading order; False
    cells get `cells.size`. Whole-grid min-propagation with pointer jumping, a few numpy passes per grid instead of
    one Python flood per component (issue #19 speed: labelling was a fifth of a generate run's time).

    >>> label(np.array([[True, False, True], [False, True, True]]), 4).tolist()
    [[0, 6, 2], [6, 2, 2]]
    """
    h, w = cells.shape
    none = cells.size
    lab = np.where(cells, np.arange(none).reshape(h, w), none)
    padded = np.full((h + 2, w + 2), none)
    while True:
        padded[1:-1, 1:-1] = lab
        new = lab
        for dr, dc in _SHIFTS[connectivity]:
            new = np.minimum(new, padded[1 + dr:1 + dr + h, 1 + dc:1 + dc + w])
        # a label is a cell of the same component with a smaller index: jump to that cell's label
        flat = np.where(cells, new, none).ravel()
        new = np.append(flat, none)[flat].reshape(h, w)
        if np.array_equal(new, lab):
            return lab
        lab = new


def components(body: np.ndarray, bg: int, connectivity: int) -> list[np.ndarray]:
    """Connected components of the non-background cells (any colours), as boolean masks in reading order.

    >>> [int(m.sum()) for m in components(np.array([[1, 0, 2], [0, 2, 2]]), 0, 4)]
    [1, 3]
    >>> [int(m.sum()) for m in components(np.array([[1, 0, 2], [0, 2, 2]]), 0, 8)]
    [4]
    """
    fg = body != bg
    lab = label(fg, connectivity)
    return [lab == first for first in np.unique(lab[fg])]


def metric(mask: np.ndarray, body: np.ndarray, name: str) -> int:
    """One number per component: cell count, bounding-box height/width/area, colours used, top row, left column.

    >>> m = np.array([[True, True], [False, True]])
    >>> [metric(m, np.array([[4, 5], [0, 5]]), n) for n in ("size", "height", "width", "bbox_area", "n_colours")]
    [3, 2, 2, 4, 2]
    """
    rows, cols = np.nonzero(mask)
    values = {"size": lambda: rows.size, "height": lambda: rows.max() - rows.min() + 1,
              "width": lambda: cols.max() - cols.min() + 1,
              "bbox_area": lambda: (rows.max() - rows.min() + 1) * (cols.max() - cols.min() + 1),
              "n_colours": lambda: np.unique(body[mask]).size, "top": lambda: rows.min(), "left": lambda: cols.min()}
    return int(values[name]())


def select(comps: list[np.ndarray], body: np.ndarray, metric_name: str, extreme: str) -> np.ndarray:
    """The one component at the extreme of the metric; a tie raises Ambiguous.

    >>> a, b = np.array([[True, False, False]]), np.array([[False, True, True]])
    >>> select([a, b], np.array([[1, 2, 2]]), "size", "max").tolist()
    [[False, True, True]]
    >>> select([a, b], np.array([[1, 2, 2]]), "height", "max")  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    training.corpus.oracle.Ambiguous: 2 components share height max = 1
    """
    if not comps:
        raise NoObjects("the body has no object")
    values = np.array([metric(m, body, metric_name) for m in comps])
    best = values.max() if extreme == "max" else values.min()
    winners = np.flatnonzero(values == best)
    if winners.size > 1:
        raise Ambiguous(f"{winners.size} components share {metric_name} {extreme} = {best}")
    return comps[int(winners[0])]


def dilate(mask: np.ndarray, amount: int, connectivity: int) -> np.ndarray:
    """Grow by `amount` steps (a cross for connectivity 4, a square for 8), clipped to the body.

    >>> dilate(np.array([[False, False, False], [False, True, False]]), 1, 4).astype(int).tolist()
    [[0, 1, 0], [1, 1, 1]]
    """
    for _ in range(amount):
        mask = _neighbours(mask, connectivity)
    return mask


def erode(mask: np.ndarray, amount: int, connectivity: int) -> np.ndarray:
    """Shrink by `amount` steps; cells outside the body count as outside the mask.

    >>> erode(np.ones((3, 3), bool), 1, 8).astype(int).tolist()
    [[0, 0, 0], [0, 1, 0], [0, 0, 0]]
    """
    for _ in range(amount):
        padded = np.pad(~mask, 1, constant_values=True)
        mask = ~_neighbours(padded, connectivity)[1:-1, 1:-1]
    return mask


def bbox_slices(mask: np.ndarray) -> tuple[slice, slice]:
    rows, cols = np.nonzero(mask)
    return slice(rows.min(), rows.max() + 1), slice(cols.min(), cols.max() + 1)


def apply_mask_op(mask: np.ndarray, op: str, amount: int, connectivity: int) -> np.ndarray:
    """keep; dilate k; erode k; outline k (the ring of thickness k inside the mask); bbox k (box grown by k).

    >>> m = np.zeros((3, 4), bool); m[1, 1] = True
    >>> apply_mask_op(m, "bbox", 1, 4).astype(int).tolist()
    [[1, 1, 1, 0], [1, 1, 1, 0], [1, 1, 1, 0]]
    >>> apply_mask_op(np.ones((3, 3), bool), "outline", 1, 4).astype(int).tolist()
    [[1, 1, 1], [1, 0, 1], [1, 1, 1]]
    """
    if op == "keep":
        out = mask
    elif op == "dilate":
        out = dilate(mask, amount, connectivity)
    elif op == "erode":
        out = erode(mask, amount, connectivity)
    elif op == "outline":
        out = mask & ~erode(mask, amount, connectivity)
    elif op == "bbox":
        out = np.zeros_like(mask)
        rs, cs = bbox_slices(mask)
        out[max(rs.start - amount, 0):rs.stop + amount, max(cs.start - amount, 0):cs.stop + amount] = True
    else:
        raise ValueError(f"unknown mask operator {op!r}")
    if not out.any():
        raise EmptyMask(f"{op} {amount} left no cell")
    return out


def apply_post(mask: np.ndarray, name: str, connectivity: int) -> np.ndarray:
    """fill_holes (holes are reached with the dual connectivity); bbox_invert; flip_lr / flip_ud inside the bbox.

    >>> ring = np.ones((3, 3), bool); ring[1, 1] = False
    >>> int(apply_post(ring, "fill_holes", 8).sum()), apply_post(ring, "bbox_invert", 8).astype(int).tolist()
    (9, [[0, 0, 0], [0, 1, 0], [0, 0, 0]])
    >>> apply_post(np.array([[True, False, False], [True, True, False]]), "flip_lr", 4).astype(int).tolist()
    [[0, 1, 0], [1, 1, 0]]
    """
    out = mask.copy()
    rs, cs = bbox_slices(mask)
    if name == "fill_holes":
        outside = np.pad(~mask, 1, constant_values=True)
        reach = label(outside, 12 - connectivity) == 0  # the outside reached from the padded corner; the rest: holes
        out = ~reach[1:-1, 1:-1]
    elif name == "bbox_invert":
        out = np.zeros_like(mask)
        out[rs, cs] = ~mask[rs, cs]
    elif name == "flip_lr":
        out[rs, cs] = mask[rs, cs][:, ::-1]
    elif name == "flip_ud":
        out[rs, cs] = mask[rs, cs][::-1, :]
    else:
        raise ValueError(f"unknown post operation {name!r}")
    if not out.any():
        raise EmptyMask(f"{name} left no cell")
    return out


def render(mask: np.ndarray, body: np.ndarray, bg: int, mark: int, renderer: str) -> np.ndarray:
    """paint (mask cells take the mark colour), erase (they take the background), crop_mask (the mask's box drawn
    in mark on background), crop_source (the body inside the mask's box, background outside the mask).

    >>> m = np.array([[False, True], [False, True]]); b = np.array([[2, 0], [2, 4]])
    >>> render(m, b, 0, 7, "paint").tolist(), render(m, b, 0, 7, "crop_source").tolist()
    ([[2, 7], [2, 7]], [[0], [4]])
    """
    if renderer == "paint":
        return np.where(mask, mark, body)
    if renderer == "erase":
        return np.where(mask, bg, body)
    rs, cs = bbox_slices(mask)
    if renderer == "crop_mask":
        return np.where(mask[rs, cs], mark, bg)
    if renderer == "crop_source":
        return np.where(mask[rs, cs], body[rs, cs], bg)
    raise ValueError(f"unknown renderer {renderer!r}")


@lru_cache(maxsize=8192)
def _labelled(body_bytes: bytes, shape: tuple[int, int], bg: int, connectivity: int) -> tuple[np.ndarray, ...]:
    """Components memoised by content: admission runs thousands of programs on the same few hundred bodies, and
    labelling is most of an oracle call (measured: about 2x faster per candidate with the cache)."""
    body = np.frombuffer(body_bytes, dtype=np.int8).reshape(shape)
    found = tuple(components(body, bg, connectivity))
    for mask in found:
        mask.flags.writeable = False  # shared between calls: nobody may change a cached mask
    return found


def labelled(body: np.ndarray, bg: int, connectivity: int) -> list[np.ndarray]:
    """`components`, memoised by content (read-only masks)."""
    return list(_labelled(np.ascontiguousarray(body, dtype=np.int8).tobytes(), body.shape, bg, connectivity))


def run(program: Program, grid: np.ndarray) -> np.ndarray:
    """The program's output on one input grid, or an OracleError."""
    bg, mark, body = parse_key(np.asarray(grid, dtype=np.int8))
    comps = labelled(body, bg, program.connectivity)
    mask = select(comps, body, program.selector.metric, program.selector.extreme)
    mask = apply_mask_op(mask, program.mask.op, program.mask.amount, program.connectivity)
    for name in program.post:
        mask = apply_post(mask, name, program.connectivity)
    return render(mask, body, bg, mark, program.renderer).astype(np.int8)
