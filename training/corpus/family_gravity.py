"""The gravity family: cells or whole objects fall in one direction until they rest on the edge or on other cells.

`movers` says what falls: every non-background cell (`all`) or only the key's mark colour (`mark`, the other
cells stay where they are, as walls). With `unit="cell"` each moving cell falls on its own, so a column compacts
against its floor; with `unit="object"` each 4-connected object of moving cells falls rigidly, the object nearest
the floor first (ties: the one whose first cell comes first in reading order), until one of its cells would leave
the body or enter an occupied cell. A body without a moving cell raises NoObjects. Neutral forms: `unit` -> cell,
`movers` -> all (the direction has none).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from training.corpus import oracle, scenes
from training.corpus.dsl import check, check_fields

# direction -> quarter turns (np.rot90) that make it "down"
TURNS = {"down": 0, "left": 1, "up": 2, "right": 3}
UNITS = ("cell", "object")
MOVERS = ("all", "mark")
FAMILY = "gravity"


@dataclass(frozen=True)
class Gravity:
    direction: str
    unit: str
    movers: str
    family: str = FAMILY
    produces = "scene"

    def __post_init__(self) -> None:
        check("direction", self.direction, tuple(TURNS))
        check("unit", self.unit, UNITS)
        check("movers", self.movers, MOVERS)
        check("family", self.family, (FAMILY,))

    def to_dict(self) -> dict:
        return {"family": FAMILY, "direction": self.direction, "unit": self.unit, "movers": self.movers}

    def variants(self) -> list["Gravity"]:
        return ([replace(self, direction=d) for d in TURNS if d != self.direction]
                + [replace(self, unit=u) for u in UNITS if u != self.unit]
                + [replace(self, movers=m) for m in MOVERS if m != self.movers])

    def neutralised(self) -> list[tuple[str, "Gravity"]]:
        """unit -> cell, movers -> all."""
        out = [("unit", replace(self, unit="cell"))] if self.unit != "cell" else []
        return out + ([("movers", replace(self, movers="all"))] if self.movers != "all" else [])

    def dropped(self) -> list:
        return []


def from_dict(data: dict) -> Gravity:
    data = check_fields(data, {"family", "direction", "unit", "movers"})
    return Gravity(data["direction"], data["unit"], data["movers"])


def all_programs() -> list[Gravity]:
    return [Gravity(d, u, m) for d in TURNS for u in UNITS for m in MOVERS]


def fall_cells(body: np.ndarray, moving: np.ndarray, bg: int) -> np.ndarray:
    """Each moving cell falls down on its own, within the stretch of its column between fixed cells.

    >>> fall_cells(np.array([[4], [0], [5], [0]]), np.array([[True], [False], [False], [False]]), 0).tolist()
    [[0], [4], [5], [0]]
    """
    out = body.copy()
    h = body.shape[0]
    for c in range(body.shape[1]):
        fixed = [r for r in range(h) if body[r, c] != bg and not moving[r, c]]
        for top, floor in zip([-1] + fixed, fixed + [h]):
            falling = [body[r, c] for r in range(top + 1, floor) if moving[r, c]]
            out[top + 1:floor, c] = bg
            if falling:
                out[floor - len(falling):floor, c] = falling
    return out


def fall_objects(body: np.ndarray, moving: np.ndarray, bg: int) -> np.ndarray:
    """Each 4-connected object of moving cells falls down rigidly, the lowest first.

    >>> fall_objects(np.array([[4, 4], [0, 4], [0, 0]]), np.array([[True] * 2, [False, True], [False] * 2]), 0).tolist()
    [[0, 0], [4, 4], [0, 4]]
    """
    lab = oracle.label(moving, 4)
    objects = [lab == first for first in np.unique(lab[moving])]
    objects.sort(key=lambda m: (-int(np.nonzero(m)[0].max()), int(np.flatnonzero(m)[0])))
    out = body.copy()
    for mask in objects:
        colours = out[mask]
        out[mask] = bg
        rows, cols = np.nonzero(mask)
        drop = 0
        while (rows.max() + drop + 1 < body.shape[0]
               and np.all(out[rows + drop + 1, cols] == bg)):
            drop += 1
        out[rows + drop, cols] = colours
    return out


def run(program: Gravity, grid: np.ndarray) -> np.ndarray:
    bg, mark, body = oracle.parse_key(np.asarray(grid, dtype=np.int8))
    turned = np.rot90(body, TURNS[program.direction])
    moving = turned != bg if program.movers == "all" else turned == mark
    if not moving.any():
        raise oracle.NoObjects("nothing to fall")
    fall = fall_cells if program.unit == "cell" else fall_objects
    return np.ascontiguousarray(np.rot90(fall(turned, moving, bg), -TURNS[program.direction]))


def random_scene(rng: np.random.Generator) -> np.ndarray:
    """2..6 small objects (bars, boxes, L shapes) in mark and 1..2 other colours, floating over the background, and
    0..2 one-cell-thick walls of another colour, so that the movers, the unit and the direction all change
    something."""
    palette = rng.permutation(10)
    bg, mark, colours = int(palette[0]), int(palette[1]), palette[2:2 + int(rng.integers(1, 3))]
    h, w = int(rng.integers(5, 13)), int(rng.integers(5, 13))
    body = np.full((h, w), bg, dtype=np.int8)
    for _ in range(int(rng.integers(2, 7))):
        bh, bw = int(rng.integers(1, 4)), int(rng.integers(1, 4))
        shape = np.ones((bh, bw), bool)
        if bh > 1 and bw > 1 and rng.random() < 0.5:
            shape[:-1, 1:] = False  # an L: objects that stop on each other's arms
        colour = mark if rng.random() < 0.5 else int(rng.choice(colours))
        r, c = int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1))
        if np.all(body[r:r + bh, c:c + bw] == bg):
            body[r:r + bh, c:c + bw] = np.where(shape, colour, bg)
    for _ in range(int(rng.integers(0, 3))):
        wall = int(rng.choice(colours))
        if rng.random() < 0.5:
            r, c0 = int(rng.integers(1, h)), int(rng.integers(0, w - 1))
            c1 = int(rng.integers(c0 + 1, w + 1))
            body[r, c0:c1] = np.where(body[r, c0:c1] == bg, wall, body[r, c0:c1])
        else:
            c, r0 = int(rng.integers(1, w)), int(rng.integers(0, h - 1))
            r1 = int(rng.integers(r0 + 1, h + 1))
            body[r0:r1, c] = np.where(body[r0:r1, c] == bg, wall, body[r0:r1, c])
    return scenes.with_key(body, bg, mark)
