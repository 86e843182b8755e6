"""The count-pack family: count the objects that have a feature, then pack one tile per counted object.

Inputs are keyed like every family's ([background, mark, background...] above the body). A program finds the
connected components of non-background cells (connectivity 4 or 8), keeps those with `feature`, and packs one 1x1
tile per kept object, in the objects' reading order, into a `layout`: a row, a column, or the smallest square that
holds them (filled row by row, the rest background). A tile is the mark colour (`tile="mark"`) or the object's own
colour at its first cell (`tile="colour"`). Nothing counted raises EmptyMask; more than 30 tiles raise TooLarge.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from training.corpus import oracle, scenes
from training.corpus.dsl import check, check_fields

FEATURES = ("any", "holed", "single_cell", "multicolour", "on_border")
LAYOUTS = ("row", "column", "square")
TILES = ("mark", "colour")
FAMILY = "count_pack"


@dataclass(frozen=True)
class CountPack:
    feature: str
    layout: str
    tile: str
    connectivity: int
    family: str = FAMILY
    produces = "crop"

    def __post_init__(self) -> None:
        check("feature", self.feature, FEATURES)
        check("layout", self.layout, LAYOUTS)
        check("tile", self.tile, TILES)
        check("connectivity", self.connectivity, (4, 8))
        check("family", self.family, (FAMILY,))

    def to_dict(self) -> dict:
        return {"family": FAMILY, "feature": self.feature, "layout": self.layout, "tile": self.tile,
                "connectivity": self.connectivity}

    def variants(self) -> list["CountPack"]:
        return ([replace(self, feature=f) for f in FEATURES if f != self.feature]
                + [replace(self, layout=v) for v in LAYOUTS if v != self.layout]
                + [replace(self, tile=t) for t in TILES if t != self.tile]
                + [replace(self, connectivity=12 - self.connectivity)])

    def neutralised(self) -> list[tuple[str, "CountPack"]]:
        """feature -> any, tile -> mark, connectivity -> the other one (the layout has no neutral form)."""
        out = [("feature", replace(self, feature="any"))] if self.feature != "any" else []
        out += [("tile", replace(self, tile="mark"))] if self.tile != "mark" else []
        return out + [("connectivity", replace(self, connectivity=12 - self.connectivity))]

    def dropped(self) -> list:
        return []


def from_dict(data: dict) -> CountPack:
    data = check_fields(data, {"family", "feature", "layout", "tile", "connectivity"})
    return CountPack(data["feature"], data["layout"], data["tile"], data["connectivity"])


def all_programs() -> list[CountPack]:
    return [CountPack(f, v, t, c) for f in FEATURES for v in LAYOUTS for t in TILES for c in (4, 8)]


def has_feature(mask: np.ndarray, body: np.ndarray, feature: str, connectivity: int) -> bool:
    """Whether one object has the feature: any; holed (it encloses background); single_cell; multicolour;
    on_border (it touches the body's edge).

    >>> ring = np.ones((3, 3), bool); ring[1, 1] = False; body = np.where(ring, 4, 0)
    >>> [has_feature(ring, body, f, 4) for f in ("holed", "single_cell", "multicolour", "on_border")]
    [True, False, False, True]
    """
    if feature == "any":
        return True
    if feature == "holed":
        return int(oracle.apply_post(mask, "fill_holes", connectivity).sum()) > int(mask.sum())
    if feature == "single_cell":
        return int(mask.sum()) == 1
    if feature == "multicolour":
        return np.unique(body[mask]).size > 1
    if feature == "on_border":
        return bool(mask[0].any() or mask[-1].any() or mask[:, 0].any() or mask[:, -1].any())
    raise ValueError(f"unknown feature {feature!r}")


def pack(tiles: list[int], layout: str, bg: int) -> np.ndarray:
    """One cell per tile, in order: a row, a column, or the smallest square (row by row, background after).

    >>> pack([3, 4, 5], "square", 0).tolist(), pack([3, 4], "column", 0).tolist()
    ([[3, 4], [5, 0]], [[3], [4]])
    """
    if not tiles:
        raise oracle.EmptyMask("no object has the feature")
    if len(tiles) > 30:
        raise oracle.TooLarge(f"{len(tiles)} tiles do not fit in 30 cells")
    if layout == "row":
        return np.array([tiles], dtype=np.int8)
    if layout == "column":
        return np.array([tiles], dtype=np.int8).T
    side = math.isqrt(len(tiles) - 1) + 1
    out = np.full(side * side, bg, dtype=np.int8)
    out[:len(tiles)] = tiles
    return out.reshape(side, side)


def run(program: CountPack, grid: np.ndarray) -> np.ndarray:
    bg, mark, body = oracle.parse_key(np.asarray(grid, dtype=np.int8))
    tiles = []
    for mask in oracle.labelled(body, bg, program.connectivity):
        if has_feature(mask, body, program.feature, program.connectivity):
            tiles.append(mark if program.tile == "mark" else int(body[mask][0]))
    return pack(tiles, program.layout, bg)


def random_scene(rng: np.random.Generator) -> np.ndarray:
    """1..7 objects of mixed kinds (single cells, hollow and solid boxes, two-coloured boxes) that never touch, some
    on the edge, and 0..2 groups of cells that touch diagonally (so that the connectivity changes the count)."""
    palette = rng.permutation(10)
    bg, mark, colours = int(palette[0]), int(palette[1]), palette[2:2 + int(rng.integers(2, 5))]
    h, w = int(rng.integers(5, 13)), int(rng.integers(5, 13))
    body = np.full((h, w), bg, dtype=np.int8)
    for _ in range(int(rng.integers(1, 8))):
        kind = int(rng.integers(4))
        bh, bw = (1, 1) if kind == 0 else (int(rng.integers(2, 5)), int(rng.integers(2, 5)))
        shape = np.ones((bh, bw), bool)
        if kind == 1 and bh > 2 and bw > 2:
            shape[1:-1, 1:-1] = False
        paint = np.full((bh, bw), rng.choice(colours), dtype=np.int8)
        if kind == 3:
            paint[:, bw // 2:] = rng.choice(colours)
        r, c = int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1))
        near = body[max(r - 1, 0):r + bh + 1, max(c - 1, 0):c + bw + 1]
        if np.all(near == bg):  # one cell of background around every object: objects never touch
            body[r:r + bh, c:c + bw] = np.where(shape, paint, bg)
    for _ in range(int(rng.integers(0, 3))):  # cells touching diagonally: one object under connectivity 8
        diamond = rng.random() < 0.4  # four cells around an empty centre: a holed object under 8, four under 4
        r, c = int(rng.integers(0, h - 2)), int(rng.integers(0, w - 2))
        if np.all(body[max(r - 1, 0):r + 4, max(c - 1, 0):c + 4] == bg):
            cells = ((0, 1), (1, 0), (1, 2), (2, 1)) if diamond else ((0, 0), (1, 1))
            for dr, dc in cells:  # each cell's colour drawn apart: sometimes a multicolour object under 8
                body[r + dr, c + dc] = rng.choice(colours)
    return scenes.with_key(body, bg, mark)
