"""The rays family: every source cell (the key's mark colour) shoots rays over the background towards walls.

A ray leaves each source in each of the program's `directions` and colours the background cells it crosses. With
`stop="wall"` it stops before the first non-background cell; with `stop="border"` it passes behind walls (leaving
them as they are) up to the body's edge. It is drawn in the mark colour (`paint="mark"`), or in the colour of the
first cell it meets (`paint="hit"`; a ray that meets nothing is not drawn). Two rays that colour one cell
differently raise Ambiguous; a body without a source raises NoObjects.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

import numpy as np

from training.corpus import oracle, scenes
from training.corpus.dsl import check, check_fields

STEPS = {"right": ((0, 1),), "left": ((0, -1),), "down": ((1, 0),), "up": ((-1, 0),),
         "horizontal": ((0, 1), (0, -1)), "vertical": ((1, 0), (-1, 0)),
         "cross": ((0, 1), (0, -1), (1, 0), (-1, 0)), "diagonal": ((1, 1), (1, -1), (-1, 1), (-1, -1))}
STOPS = ("wall", "border")
PAINTS = ("mark", "hit")
FAMILY = "rays"


@dataclass(frozen=True)
class Rays:
    directions: str
    stop: str
    paint: str
    family: str = FAMILY
    produces = "scene"

    def __post_init__(self) -> None:
        check("directions", self.directions, tuple(STEPS))
        check("stop", self.stop, STOPS)
        check("paint", self.paint, PAINTS)
        check("family", self.family, (FAMILY,))

    def to_dict(self) -> dict:
        return {"family": FAMILY, "directions": self.directions, "stop": self.stop, "paint": self.paint}

    def variants(self) -> list["Rays"]:
        return ([replace(self, directions=d) for d in STEPS if d != self.directions]
                + [replace(self, stop=s) for s in STOPS if s != self.stop]
                + [replace(self, paint=p) for p in PAINTS if p != self.paint])

    def neutralised(self) -> list[tuple[str, "Rays"]]:
        """stop -> wall, paint -> mark (the directions have no neutral form)."""
        out = [("stop", replace(self, stop="wall"))] if self.stop != "wall" else []
        return out + ([("paint", replace(self, paint="mark"))] if self.paint != "mark" else [])

    def dropped(self) -> list:
        return []


def from_dict(data: dict) -> Rays:
    data = check_fields(data, {"family", "directions", "stop", "paint"})
    return Rays(data["directions"], data["stop"], data["paint"])


def all_programs() -> list[Rays]:
    return [Rays(d, s, p) for d in STEPS for s in STOPS for p in PAINTS]


UNIT_STEPS = tuple(dict.fromkeys(step for steps in STEPS.values() for step in steps))  # the 8 neighbours
_COLUMNS = {name: [UNIT_STEPS.index(step) for step in steps] for name, steps in STEPS.items()}


@lru_cache(maxsize=128)
def _rays(h: int, w: int) -> tuple[np.ndarray, np.ndarray]:
    """(flat, inside) of the rays from every cell of an h x w body in the 8 UNIT_STEPS: (h*w, 8, L) flat indices of
    each ray's L = max(h, w) cells from its start outwards (0 where outside), and whether each is inside the body.
    Built once per shape (the scenes' bodies are at most 13 x 13: 81 shapes, 53 kB each at most), so that a run only
    indexes it by its sources: that halved the time of a run on the family's scenes."""
    length = max(h, w)
    steps = np.array(UNIT_STEPS)
    reach = np.arange(1, length + 1)
    starts = np.indices((h, w)).reshape(2, -1).T
    rows = starts[:, None, 0:1] + steps[None, :, 0:1] * reach
    cols = starts[:, None, 1:2] + steps[None, :, 1:2] * reach
    inside = (rows >= 0) & (rows < h) & (cols >= 0) & (cols < w)
    flat = np.where(inside, rows * w + cols, 0).astype(np.int16)
    flat.flags.writeable = inside.flags.writeable = False
    return flat, inside


def trace(body: np.ndarray, starts: np.ndarray, directions: str, bg: int, stop: str):
    """Every ray at once, one per start (flat indices into the body) and direction, numbered start-major:
    (crossed, flat, hits). Row i of `flat` (n*d, L) holds the flat index of ray i's L = max(h, w) cells from its
    start outwards, `crossed` marks the background cells it colours, and `hits` (n*d,) the colour of the first cell it
    meets, or -1. No Python loop over cells or rays.

    >>> crossed, flat, hits = trace(np.array([[3, 0, 0, 5, 0]]), np.array([0]), "right", 0, "wall")
    >>> flat[crossed].tolist(), hits.tolist()
    ([1, 2], [5])
    >>> crossed, flat, hits = trace(np.array([[3, 0, 0, 5, 0]]), np.array([0]), "right", 0, "border")
    >>> flat[crossed].tolist(), hits.tolist()
    ([1, 2, 4], [5])
    """
    every_flat, every_inside = _rays(*body.shape)
    length, columns = every_flat.shape[-1], _COLUMNS[directions]
    flat = every_flat[starts[:, None], columns].reshape(-1, length)
    inside = every_inside[starts[:, None], columns].reshape(-1, length)
    values = body.ravel()[flat]
    walls = inside & (values != bg)
    first = walls.argmax(axis=1)  # 0 also when the ray meets nothing: `met` tells the two apart
    rays = np.arange(len(first))
    met = walls[rays, first]
    hits = np.where(met, values[rays, first], -1)
    crossed = inside & (values == bg)
    if stop == "wall":
        crossed &= np.arange(length) < np.where(met, first, length)[:, None]  # the cells before the first wall
    return crossed, flat, hits


def run(program: Rays, grid: np.ndarray) -> np.ndarray:
    bg, mark, body = oracle.parse_key(np.asarray(grid, dtype=np.int8))
    sources = np.flatnonzero(body == mark)
    if not sources.size:
        raise oracle.NoObjects("no source cell")
    crossed, flat, hits = trace(body, sources, program.directions, bg, program.stop)
    out = body.copy()
    if program.paint == "mark":  # every ray has one colour: nothing can clash
        out.ravel()[flat[crossed]] = mark
        return out
    crossed &= (hits >= 0)[:, None]  # a hit-coloured ray that meets nothing is not drawn
    ray, _ = np.nonzero(crossed)
    cells, colours = flat[crossed], hits[ray]
    seen = np.zeros((body.size, 10), dtype=bool)
    seen[cells, colours] = True
    clash = np.flatnonzero(seen.sum(axis=1) > 1)
    if clash.size:
        raise oracle.Ambiguous(f"two rays colour cell {divmod(int(clash[0]), body.shape[1])} differently")
    out.ravel()[cells] = colours
    return out


def random_scene(rng: np.random.Generator) -> np.ndarray:
    """1..3 single source cells and 2..5 walls (lines and boxes of other colours) on the background."""
    palette = rng.permutation(10)
    bg, mark, colours = int(palette[0]), int(palette[1]), palette[2:2 + int(rng.integers(1, 4))]
    h, w = int(rng.integers(5, 14)), int(rng.integers(5, 14))
    body = np.full((h, w), bg, dtype=np.int8)
    for _ in range(int(rng.integers(2, 6))):
        if rng.random() < 0.4:
            bh, bw = 1, int(rng.integers(2, w))
        else:
            bh, bw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        if rng.random() < 0.5:
            bh, bw = bw, bh
        bh, bw = min(bh, h), min(bw, w)
        r, c = int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1))
        body[r:r + bh, c:c + bw] = rng.choice(colours)
    free = np.flatnonzero(body.ravel() == bg)
    for cell in rng.choice(free, size=min(int(rng.integers(1, 4)), free.size), replace=False):
        body.flat[int(cell)] = mark
    return scenes.with_key(body, bg, mark)
