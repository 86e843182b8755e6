"""The symmetry-repair family: a symmetric template with one damaged region; restore it from its mirror images.

The palette key's mark colour names the damage role when `damage="mark"`; with `damage="background"` the damaged
cells are the background-coloured ones (templates of this family cover their whole body). Each damaged cell takes
the value of its undamaged mirror images under the program's symmetry (`lr`, `ud`, `rot180`, or `both` = lr and ud);
mirror images that disagree, or none undamaged, raise Ambiguous; a repaired body that is not symmetric raises
Asymmetric (the input is not of that template). The output is the repaired body, or only the `patch` that was
damaged (the repaired cells in the damage's bounding box).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from training.corpus import oracle, scenes
from training.corpus.dsl import check, check_fields

AXES = ("lr", "ud", "rot180", "both")
DAMAGES = ("mark", "background")
OUTPUTS = ("repaired", "patch")
FAMILY = "symmetry_repair"
MIRRORS = {"lr": ("lr",), "ud": ("ud",), "rot180": ("rot180",), "both": ("lr", "ud", "rot180")}


@dataclass(frozen=True)
class SymmetryRepair:
    axis: str
    damage: str
    output: str
    family: str = FAMILY

    def __post_init__(self) -> None:
        check("axis", self.axis, AXES)
        check("damage", self.damage, DAMAGES)
        check("output", self.output, OUTPUTS)
        check("family", self.family, (FAMILY,))

    @property
    def produces(self) -> str:
        return "scene" if self.output == "repaired" else "crop"

    def to_dict(self) -> dict:
        return {"family": FAMILY, "axis": self.axis, "damage": self.damage, "output": self.output}

    def variants(self) -> list["SymmetryRepair"]:
        return ([replace(self, axis=a) for a in AXES if a != self.axis]
                + [replace(self, damage=d) for d in DAMAGES if d != self.damage]
                + [replace(self, output=o) for o in OUTPUTS if o != self.output])

    def neutralised(self) -> list:
        """No stage has a neutral form: the one-node variants identify them (as the selector in select-mask-render)."""
        return []

    def dropped(self) -> list:
        return []


def from_dict(data: dict) -> SymmetryRepair:
    data = check_fields(data, {"family", "axis", "damage", "output"})
    return SymmetryRepair(data["axis"], data["damage"], data["output"])


def all_programs() -> list[SymmetryRepair]:
    return [SymmetryRepair(a, d, o) for a in AXES for d in DAMAGES for o in OUTPUTS]


def mirror(grid: np.ndarray, name: str) -> np.ndarray:
    """lr (left-right), ud (up-down) or rot180.

    >>> mirror(np.array([[1, 2], [3, 4]]), "lr").tolist(), mirror(np.array([[1, 2], [3, 4]]), "rot180").tolist()
    ([[2, 1], [4, 3]], [[4, 3], [2, 1]])
    """
    return {"lr": grid[:, ::-1], "ud": grid[::-1], "rot180": grid[::-1, ::-1]}[name]


def repair(body: np.ndarray, damaged: np.ndarray, axis: str) -> np.ndarray:
    """Each damaged cell takes its undamaged mirror images' common value.

    >>> repair(np.array([[1, 2, 9, 1]]), np.array([[False, False, True, False]]), "lr").tolist()
    [[1, 2, 2, 1]]
    """
    out = body.copy()
    images = [(mirror(body, m), mirror(damaged, m)) for m in MIRRORS[axis]]
    for r, c in zip(*np.nonzero(damaged)):
        values = {int(img[r, c]) for img, hurt in images if not hurt[r, c]}
        if len(values) != 1:
            raise oracle.Ambiguous(f"cell {(int(r), int(c))} has {len(values)} candidate values")
        out[r, c] = values.pop()
    if any(not np.array_equal(mirror(out, m), out) for m in MIRRORS[axis]):
        raise oracle.Asymmetric(f"the repaired body is not {axis}-symmetric")
    return out


def run(program: SymmetryRepair, grid: np.ndarray) -> np.ndarray:
    bg, mark, body = oracle.parse_key(np.asarray(grid, dtype=np.int8))
    damaged = body == (mark if program.damage == "mark" else bg)
    if not damaged.any():
        raise oracle.NoObjects("no damaged cell")
    out = repair(body, damaged, program.axis)
    if program.output == "patch":
        rs, cs = oracle.bbox_slices(damaged)
        return out[rs, cs]
    return out


def random_scene(rng: np.random.Generator) -> np.ndarray:
    """A template of colours other than the key's two, symmetric under lr and ud (half of the scenes) or under one
    of lr, ud, rot180; then one damaged box, in mark or background colour, inside one quadrant so that its mirror
    images are intact under every axis, or (30%) stretched across one mirror line so that `both` and one axis can
    repair it and the other axis cannot, or (14%) doubled by its rot180 image (the scenes that tell `both` apart)."""
    palette = rng.permutation(10)
    bg, mark, colours = int(palette[0]), int(palette[1]), palette[2:2 + int(rng.integers(2, 5))]
    h, w = int(rng.integers(4, 13)), int(rng.integers(4, 13))
    body = rng.choice(colours, size=(h, w)).astype(np.int8)
    index = np.arange(h * w).reshape(h, w)
    axis = "both" if rng.random() < 0.5 else AXES[int(rng.integers(3))]
    for m in MIRRORS[axis]:
        body = body.ravel()[np.minimum(index, mirror(index, m))].reshape(h, w)  # copy the earlier cell of each pair
    dh, dw = int(rng.integers(1, h // 2 + 1)), int(rng.integers(1, w // 2 + 1))
    r, c = int(rng.integers(0, h // 2 - dh + 1)), int(rng.integers(0, w // 2 - dw + 1))
    if rng.random() < 0.5:
        r = h - r - dh
    if rng.random() < 0.5:
        c = w - c - dw
    across = rng.random()
    if across < 0.15:  # across the vertical mirror line: only ud (or rot180) images are intact
        c, dw = c if c < w // 2 else w - c - dw, w - 2 * min(c, w - c - dw)
    elif across < 0.3:  # across the horizontal mirror line: only lr (or rot180) images are intact
        r, dh = r if r < h // 2 else h - r - dh, h - 2 * min(r, h - r - dh)
    damage = mark if rng.random() < 0.5 else bg
    body[r:r + dh, c:c + dw] = damage
    if across >= 0.3 and rng.random() < 0.2:  # and its rot180 image: only lr and ud images are intact
        body[h - r - dh:h - r, w - c - dw:w - c] = damage
    return scenes.with_key(body, bg, mark)
