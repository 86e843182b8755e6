"""Scenes for the select-mask-render family: inputs with a palette key, a fresh palette per pair.

An input is a key row [background, mark, background...] above a body of 2..5 small objects on the background. The
palette (background, mark, object colours) is redrawn for every scene, so a rule can only depend on colour roles,
never on absolute colours. Sizes stay within 1..30 and colours within 0..9. `probe_bank()` is the fixed bank that
admission runs every candidate on; it is built from a constant seed and never changes between runs.
"""

from __future__ import annotations

import numpy as np

from training.corpus import oracle
from training.corpus.dsl import Program

PROBE_SEED = 20261201
PROBE_SCENES = 40
PROBE_NOISE = 8


def with_key(body: np.ndarray, bg: int, mark: int) -> np.ndarray:
    """Put the palette key row above a body.

    >>> with_key(np.array([[5, 0, 0]]), 0, 3).tolist()
    [[0, 3, 0], [5, 0, 0]]
    """
    key = np.full((1, body.shape[1]), bg, dtype=np.int8)
    key[0, 1] = mark
    return np.vstack([key, body.astype(np.int8)])


def _blob(rng: np.random.Generator, colours: np.ndarray) -> np.ndarray:
    """A random shape in a box of 1..5 x 1..5 cells, coloured from `colours` (-1 = empty): a 4-connected random
    walk, a solid box or a hollow box, so that erosion, outlines and hole filling have something to act on."""
    h, w = int(rng.integers(1, 6)), int(rng.integers(1, 6))
    kind = int(rng.integers(3))
    if kind == 1:
        shape = np.ones((h, w), bool)
    elif kind == 2:
        shape = np.ones((h, w), bool)
        shape[1:-1, 1:-1] = False
    else:
        shape = np.zeros((h, w), bool)
        r, c = int(rng.integers(h)), int(rng.integers(w))
        shape[r, c] = True
        for _ in range(int(rng.integers(0, 2 * h * w))):
            dr, dc = ((1, 0), (-1, 0), (0, 1), (0, -1))[int(rng.integers(4))]  # a random walk stays 4-connected
            r, c = int(np.clip(r + dr, 0, h - 1)), int(np.clip(c + dc, 0, w - 1))
            shape[r, c] = True
    paint = rng.choice(colours, size=shape.shape) if rng.random() < 0.3 else np.full(shape.shape, colours[0])
    return np.where(shape, paint, -1)


def random_scene(rng: np.random.Generator) -> np.ndarray:
    """One input: a fresh palette, a 5..14 x 5..14 body and 2..5 objects placed without overlap."""
    palette = rng.permutation(10)
    bg, mark, colours = int(palette[0]), int(palette[1]), palette[2:2 + int(rng.integers(1, 4))]
    h, w = int(rng.integers(5, 15)), int(rng.integers(5, 15))
    body = np.full((h, w), bg, dtype=np.int8)
    for _ in range(int(rng.integers(2, 6))):
        blob = _blob(rng, rng.permutation(colours))
        bh, bw = blob.shape
        if bh > h or bw > w:
            continue
        for _attempt in range(10):
            r, c = int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1))
            if np.all(body[r:r + bh, c:c + bw][blob >= 0] == bg):
                body[r:r + bh, c:c + bw] = np.where(blob >= 0, blob, body[r:r + bh, c:c + bw])
                break
    return with_key(body, bg, mark)


def propose(program: Program, rng: np.random.Generator, tries: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """An (input, output) pair on which the oracle gives one answer; ValueError when `tries` scenes all fail."""
    for _ in range(tries):
        grid = random_scene(rng)
        try:
            return grid, oracle.run(program, grid)
        except oracle.OracleError:
            continue
    raise ValueError(f"no unambiguous scene in {tries} tries for {program}")


def probe_bank() -> tuple[np.ndarray, ...]:
    """The fixed probe bank: typed scenes of the family, then noise grids that still carry a key."""
    rng = np.random.default_rng(PROBE_SEED)
    probes = [random_scene(rng) for _ in range(PROBE_SCENES)]
    for _ in range(PROBE_NOISE):
        bg, mark = (int(x) for x in rng.choice(10, 2, replace=False))
        h, w = int(rng.integers(3, 9)), int(rng.integers(3, 9))
        body = np.where(rng.random((h, w)) < 0.4, rng.integers(0, 10, (h, w)), bg)
        probes.append(with_key(body, bg, mark))
    return tuple(probes)
