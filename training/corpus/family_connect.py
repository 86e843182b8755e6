"""The connect family: lines between points of the same colour that face each other along an axis.

A point is a non-background cell with no non-background 8-neighbour. Two points of one colour are joined when they
lie on one line of the program's `axes` (horizontal, vertical, both, or the two diagonals) with no point of their
colour between them. With `block="clear"` they are joined only when every cell between them is background; with
`block="through"` the line passes other cells, leaving them as they are. The line is painted in the points' `own`
colour or in the key's `mark` colour. Two lines that colour one cell differently raise Ambiguous; a body with no
pair to join raises EmptyMask. Neutral forms: block -> clear, paint -> own (the axes have none).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from training.corpus import oracle, scenes
from training.corpus.dsl import check, check_fields

STEPS = {"horizontal": ((0, 1),), "vertical": ((1, 0),), "both": ((0, 1), (1, 0)), "diagonal": ((1, 1), (1, -1))}
BLOCKS = ("clear", "through")
PAINTS = ("own", "mark")
FAMILY = "connect"


@dataclass(frozen=True)
class Connect:
    axes: str
    block: str
    paint: str
    family: str = FAMILY
    produces = "scene"

    def __post_init__(self) -> None:
        check("axes", self.axes, tuple(STEPS))
        check("block", self.block, BLOCKS)
        check("paint", self.paint, PAINTS)
        check("family", self.family, (FAMILY,))

    def to_dict(self) -> dict:
        return {"family": FAMILY, "axes": self.axes, "block": self.block, "paint": self.paint}

    def variants(self) -> list["Connect"]:
        return ([replace(self, axes=a) for a in STEPS if a != self.axes]
                + [replace(self, block=b) for b in BLOCKS if b != self.block]
                + [replace(self, paint=p) for p in PAINTS if p != self.paint])

    def neutralised(self) -> list[tuple[str, "Connect"]]:
        """block -> clear, paint -> own."""
        out = [("block", replace(self, block="clear"))] if self.block != "clear" else []
        return out + ([("paint", replace(self, paint="own"))] if self.paint != "own" else [])

    def dropped(self) -> list:
        return []


def from_dict(data: dict) -> Connect:
    data = check_fields(data, {"family", "axes", "block", "paint"})
    return Connect(data["axes"], data["block"], data["paint"])


def all_programs() -> list[Connect]:
    return [Connect(a, b, p) for a in STEPS for b in BLOCKS for p in PAINTS]


def points(body: np.ndarray, bg: int) -> np.ndarray:
    """Cells that are not background and have no non-background 8-neighbour.

    >>> points(np.array([[3, 0, 0], [0, 0, 4], [0, 0, 4]]), 0).astype(int).tolist()
    [[1, 0, 0], [0, 0, 0], [0, 0, 0]]
    """
    fg = np.pad(body != bg, 1)
    h, w = body.shape
    neighbours = sum(fg[1 + dr:1 + dr + h, 1 + dc:1 + dc + w]
                     for dr in (-1, 0, 1) for dc in (-1, 0, 1) if (dr, dc) != (0, 0))
    return (body != bg) & (neighbours == 0)


def run(program: Connect, grid: np.ndarray) -> np.ndarray:
    bg, mark, body = oracle.parse_key(np.asarray(grid, dtype=np.int8))
    is_point = points(body, bg)
    drawn: dict[tuple[int, int], int] = {}
    for r, c in zip(*np.nonzero(is_point)):
        colour = int(body[r, c])
        for dr, dc in STEPS[program.axes]:
            between, (y, x) = [], (r + dr, c + dc)
            while 0 <= y < body.shape[0] and 0 <= x < body.shape[1] and not (is_point[y, x] and body[y, x] == colour):
                between.append((y, x))
                y, x = y + dr, x + dc
            if not (0 <= y < body.shape[0] and 0 <= x < body.shape[1]):
                continue  # no partner on this line
            free = [cell for cell in between if body[cell] == bg]
            if program.block == "clear" and len(free) < len(between):
                continue
            for cell in free:
                line = colour if program.paint == "own" else mark
                if drawn.setdefault(cell, line) != line:
                    raise oracle.Ambiguous(f"two lines colour cell {cell} differently")
    if not drawn:
        raise oracle.EmptyMask("no two points to join")
    out = body.copy()
    for cell, colour in drawn.items():
        out[cell] = colour
    return out


def random_scene(rng: np.random.Generator) -> np.ndarray:
    """2..5 pairs of isolated points of 1..3 colours (mark excluded), the first two on a row and a column, the
    others on a random line (the diagonals included), and behind some of them a wall (a two-cell bar across the
    line) that only `block="through"` lines cross."""
    palette = rng.permutation(10)
    bg, mark, colours = int(palette[0]), int(palette[1]), palette[2:2 + int(rng.integers(1, 4))]
    h, w = int(rng.integers(6, 14)), int(rng.integers(6, 14))
    body = np.full((h, w), bg, dtype=np.int8)
    lines = ((0, 1), (1, 0), (1, 1), (1, -1))
    for n in range(int(rng.integers(2, 6))):
        dr, dc = lines[n] if n < 2 else lines[int(rng.integers(4))]
        longest = (h - 1 if dr else w - 1) if not (dr and dc) else min(h, w) - 1
        span = int(rng.integers(2, longest + 1))
        r = int(rng.integers(0, h - dr * span))
        c = int(rng.integers(max(0, -dc * span), w - max(0, dc * span)))
        ends = ((r, c), (r + dr * span, c + dc * span))
        if not all(np.all(body[max(y - 1, 0):y + 2, max(x - 1, 0):x + 2] == bg) for y, x in ends):
            continue
        colour = int(rng.choice(colours))
        for y, x in ends:
            body[y, x] = colour
        if rng.random() < 0.4:  # a wall across the middle, away from both points
            k = span // 2
            y, x = r + dr * k, c + dc * k
            wall = [(y, x), (y + dc, x + dr)] if (dr, dc) in lines[:2] else [(y, x), (y, x + 1)]
            near_end = any(max(abs(y0 - e[0]), abs(x0 - e[1])) < 2 for y0, x0 in wall for e in ends)
            if not near_end and all(0 <= y0 < h and 0 <= x0 < w and body[y0, x0] == bg for y0, x0 in wall):
                for y0, x0 in wall:
                    body[y0, x0] = int(rng.choice(colours))
    return scenes.with_key(body, bg, mark)
