"""Panel inputs for PARALLEL composites: two keyed scenes side by side (or stacked) behind one palette key.

A panel input's key row is [background, mark, divider, background...]: the third cell names the divider colour,
which occurs in the body only as one full column (panels side by side) or one full row (stacked) between the two
panels. Single rules read [background, mark, background...] and so refuse a panel input (BadKey): panel probes cost
them nothing and leave their behaviours as they were. `split` is the reading, `join` puts two outputs together with
a divider line between them, and `panel_scene` builds an input from two keyed scenes (the second recoloured to share
the first's background and mark).
"""

from __future__ import annotations

import numpy as np

from training.corpus import oracle, scenes

AXES = ("side", "stack")  # side: panels left | right (a divider column); stack: top over bottom (a divider row)


def split(grid: np.ndarray) -> tuple[int, int, int, str, np.ndarray, np.ndarray]:
    """(background, mark, divider, axis, first panel, second panel) of a panel input, or BadKey.

    >>> bg, mark, div, axis, a, b = split(np.array([[0, 3, 7, 0, 0], [5, 0, 7, 3, 0], [0, 5, 7, 0, 0]]))
    >>> div, axis, a.tolist(), b.tolist()
    (7, 'side', [[5, 0], [0, 5]], [[3, 0], [0, 0]])
    """
    grid = np.asarray(grid, dtype=np.int8)
    if grid.ndim != 2 or grid.shape[0] < 2 or grid.shape[1] < 3:
        raise oracle.BadKey(f"grid of shape {grid.shape} has no room for a panel key and a body")
    bg, mark, div = (int(v) for v in grid[0, :3])
    if len({bg, mark, div}) < 3 or (grid[0, 3:] != bg).any():
        raise oracle.BadKey("the top row is not [background, mark, divider, background...]")
    body = grid[1:]
    at = body == div
    cols, rows = np.flatnonzero(at.all(axis=0)), np.flatnonzero(at.all(axis=1))
    if len(cols) + len(rows) != 1 or at.sum() != (body.shape[0] if len(cols) else body.shape[1]):
        raise oracle.BadKey("the divider colour does not form exactly one full row or column")
    if len(cols):
        axis, first, second = "side", body[:, :cols[0]], body[:, cols[0] + 1:]
    else:
        axis, first, second = "stack", body[:rows[0]], body[rows[0] + 1:]
    if min(first.shape + second.shape) < 2:
        raise oracle.BadKey("a panel narrower than 2 cells has no room for its key")
    return bg, mark, div, axis, first, second


def join(first: np.ndarray, second: np.ndarray, div: int, axis: str) -> np.ndarray:
    """Two outputs with a divider line between them: side by side (equal heights) or stacked (equal widths).

    >>> join(np.array([[1]]), np.array([[2, 2]]), 7, "side").tolist()
    [[1, 7, 2, 2]]
    """
    along = 1 if axis == "side" else 0
    if first.shape[1 - along] != second.shape[1 - along]:
        raise oracle.Unjoinable(f"outputs of shapes {first.shape} and {second.shape} cannot be joined ({axis})")
    line = np.full((first.shape[0], 1) if along else (1, first.shape[1]), div, dtype=np.int8)
    out = np.concatenate([first.astype(np.int8), line, second.astype(np.int8)], axis=along)
    if max(out.shape) > 30:
        raise oracle.TooLarge(f"joined output of shape {out.shape} exceeds 30 x 30")
    return out


def panel_scene(first: np.ndarray, second: np.ndarray, axis: str, rng: np.random.Generator) -> np.ndarray | None:
    """A panel input from two keyed scenes, or None when no colour is left for the divider or it exceeds 30 x 30.

    The second scene's colours are permuted so that its background and mark are the first's; the shorter panel
    (side) or narrower one (stack) is padded with background at its bottom or right.
    """
    bg, mark, a = oracle.parse_key(np.asarray(first, dtype=np.int8))
    bg2, mark2, b = oracle.parse_key(np.asarray(second, dtype=np.int8))
    perm = np.arange(10)
    for src, dst in ((bg2, bg), (mark2, mark)):  # perm[src] = dst by one swap (the first swap survives the second)
        j = int(np.flatnonzero(perm == dst)[0])
        perm[src], perm[j] = perm[j], perm[src]
    b = perm[b].astype(np.int8)
    free = sorted(set(range(10)) - {bg, mark} - set(np.unique(a).tolist()) - set(np.unique(b).tolist()))
    if not free:
        return None
    div = int(rng.choice(free))
    along = 1 if axis == "side" else 0
    size = max(a.shape[1 - along], b.shape[1 - along])
    a, b = (np.pad(p, ((0, size - p.shape[0]), (0, 0)) if along else ((0, 0), (0, size - p.shape[1])),
                   constant_values=bg) for p in (a, b))
    body = np.concatenate([a, np.full((size, 1) if along else (1, size), div, dtype=np.int8), b], axis=along)
    if max(body.shape) > 29:
        return None
    key = scenes.with_key(body, bg, mark)
    key[0, 2] = div
    return key
