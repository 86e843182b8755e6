"""The recolour family: every object whose property passes a test is painted in the key's mark colour.

Objects are the connected components of non-background cells (connectivity 4 or 8). A `prop` (size in cells,
height, width) is measured on each, and every object that passes the `test` is painted in the mark colour: `max` or
`min` (all objects at the extreme, ties included, unlike select-mask-render, which refuses a tie), `odd` (an odd
value), or `unique` (no other object has that value). The other objects are kept (`others="keep"`) or erased
(`others="erase"`). A body without objects raises NoObjects; no object passing raises EmptyMask. Neutral forms:
others -> keep, connectivity -> the other one (the property and the test have none).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

import numpy as np

from training.corpus import oracle, scenes
from training.corpus.dsl import check, check_fields

PROPS = ("size", "height", "width")
TESTS = ("max", "min", "odd", "unique")
OTHERS = ("keep", "erase")
FAMILY = "recolour"


@dataclass(frozen=True)
class Recolour:
    prop: str
    test: str
    others: str
    connectivity: int
    family: str = FAMILY
    produces = "scene"

    def __post_init__(self) -> None:
        check("prop", self.prop, PROPS)
        check("test", self.test, TESTS)
        check("others", self.others, OTHERS)
        check("connectivity", self.connectivity, (4, 8))
        check("family", self.family, (FAMILY,))

    def to_dict(self) -> dict:
        return {"family": FAMILY, "prop": self.prop, "test": self.test, "others": self.others,
                "connectivity": self.connectivity}

    def variants(self) -> list["Recolour"]:
        return ([replace(self, prop=p) for p in PROPS if p != self.prop]
                + [replace(self, test=t) for t in TESTS if t != self.test]
                + [replace(self, others=o) for o in OTHERS if o != self.others]
                + [replace(self, connectivity=12 - self.connectivity)])

    def neutralised(self) -> list[tuple[str, "Recolour"]]:
        """others -> keep, connectivity -> the other one."""
        out = [("others", replace(self, others="keep"))] if self.others != "keep" else []
        return out + [("connectivity", replace(self, connectivity=12 - self.connectivity))]

    def dropped(self) -> list:
        return []


def from_dict(data: dict) -> Recolour:
    data = check_fields(data, {"family", "prop", "test", "others", "connectivity"})
    return Recolour(data["prop"], data["test"], data["others"], data["connectivity"])


def all_programs() -> list[Recolour]:
    return [Recolour(p, t, o, c) for p in PROPS for t in TESTS for o in OTHERS for c in (4, 8)]


def passing(values: list[int], test: str) -> list[bool]:
    """Which values pass the test.

    >>> passing([2, 3, 3, 1], "max"), passing([2, 3, 3, 1], "odd"), passing([2, 3, 3, 1], "unique")
    ([False, True, True, False], [False, True, True, True], [True, False, False, True])
    """
    if test == "max":
        return [v == max(values) for v in values]
    if test == "min":
        return [v == min(values) for v in values]
    if test == "odd":
        return [v % 2 == 1 for v in values]
    if test == "unique":
        counts = Counter(values)
        return [counts[v] == 1 for v in values]
    raise ValueError(f"unknown test {test!r}")


def run(program: Recolour, grid: np.ndarray) -> np.ndarray:
    bg, mark, body = oracle.parse_key(np.asarray(grid, dtype=np.int8))
    objects = oracle.labelled(body, bg, program.connectivity)
    if not objects:
        raise oracle.NoObjects("the body has no object")
    values = [oracle.metric(mask, body, program.prop) for mask in objects]
    chosen = passing(values, program.test)
    if not any(chosen):
        raise oracle.EmptyMask(f"no object passes {program.prop} {program.test}")
    out = body.copy()
    for mask, keep in zip(objects, chosen):
        if keep:
            out[mask] = mark
        elif program.others == "erase":
            out[mask] = bg
    return out


def random_scene(rng: np.random.Generator) -> np.ndarray:
    """3..7 bars and boxes of a few sizes (so values tie), in 1..3 colours other than mark, never touching side by
    side, and sometimes touching at a corner (so that the connectivity changes the objects)."""
    palette = rng.permutation(10)
    bg, mark, colours = int(palette[0]), int(palette[1]), palette[2:2 + int(rng.integers(1, 4))]
    h, w = int(rng.integers(6, 14)), int(rng.integers(6, 14))
    body = np.full((h, w), bg, dtype=np.int8)
    shapes = ((1, 1), (1, 2), (2, 1), (1, 3), (3, 1), (2, 2), (2, 3))
    for _ in range(int(rng.integers(3, 8))):
        bh, bw = shapes[int(rng.integers(len(shapes)))]
        r, c = int(rng.integers(0, h - bh + 1)), int(rng.integers(0, w - bw + 1))
        around = body[max(r - 1, 0):r + bh + 1, c:c + bw], body[r:r + bh, max(c - 1, 0):c + bw + 1]
        if all(np.all(a == bg) for a in around):  # no side contact; a corner contact joins them under 8
            body[r:r + bh, c:c + bw] = rng.choice(colours)
    return scenes.with_key(body, bg, mark)
