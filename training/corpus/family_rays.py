"""The rays family: every source cell (the key's mark colour) shoots rays over the background towards walls.

A ray leaves each source in each of the program's `directions` and colours the background cells it crosses. With
`stop="wall"` it stops before the first non-background cell; with `stop="border"` it passes behind walls (leaving
them as they are) up to the body's edge. It is drawn in the mark colour (`paint="mark"`), or in the colour of the
first cell it meets (`paint="hit"`; a ray that meets nothing is not drawn). Two rays that colour one cell
differently raise Ambiguous; a body without a source raises NoObjects.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

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


def trace(body: np.ndarray, start: tuple[int, int], step: tuple[int, int], bg: int, stop: str):
    """(the background cells a ray crosses, the colour of the first cell it meets or None).

    >>> trace(np.array([[3, 0, 0, 5, 0]]), (0, 0), (0, 1), 0, "wall")
    ([(0, 1), (0, 2)], 5)
    >>> trace(np.array([[3, 0, 0, 5, 0]]), (0, 0), (0, 1), 0, "border")
    ([(0, 1), (0, 2), (0, 4)], 5)
    """
    cells, hit = [], None
    r, c = start[0] + step[0], start[1] + step[1]
    while 0 <= r < body.shape[0] and 0 <= c < body.shape[1]:
        if body[r, c] == bg:
            cells.append((r, c))
        else:
            hit = int(body[r, c]) if hit is None else hit
            if stop == "wall":
                break
        r, c = r + step[0], c + step[1]
    return cells, hit


def run(program: Rays, grid: np.ndarray) -> np.ndarray:
    bg, mark, body = oracle.parse_key(np.asarray(grid, dtype=np.int8))
    sources = list(zip(*np.nonzero(body == mark)))
    if not sources:
        raise oracle.NoObjects("no source cell")
    drawn: dict[tuple[int, int], int] = {}
    for start in sources:
        for step in STEPS[program.directions]:
            cells, hit = trace(body, start, step, bg, program.stop)
            colour = mark if program.paint == "mark" else hit
            if colour is None:
                continue
            for cell in cells:
                if drawn.setdefault(cell, colour) != colour:
                    raise oracle.Ambiguous(f"two rays colour cell {cell} differently")
    out = body.copy()
    for (r, c), colour in drawn.items():
        out[r, c] = colour
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
