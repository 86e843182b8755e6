"""Views of a task: a dihedral transform, a colour permutation and a demonstration order, each exactly invertible.

A view changes what the model sees (second attempts reorder the demonstrations; augmentation uses all three); the
answer it gives is mapped back with `View.invert_grid`, so inverse(view(g)) == g for every grid (property-tested).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import numpy as np

from submission.grids import COLOURS, Grid
from submission.tasks import Pair, Task

IDENTITY_COLOURS = tuple(range(COLOURS))

# The 8 elements of the dihedral group of the square, as array operations. Index = the view's `dihedral` number.
_DIHEDRAL = (
    lambda a: a,
    lambda a: np.rot90(a, 1),
    lambda a: np.rot90(a, 2),
    lambda a: np.rot90(a, 3),
    np.fliplr,
    np.flipud,
    lambda a: a.T,
    lambda a: np.rot90(a, 2).T,  # reflection in the anti-diagonal
)
_DIHEDRAL_INVERSE = (0, 3, 2, 1, 4, 5, 6, 7)
DIHEDRAL_NAMES = ("identity", "rot90", "rot180", "rot270", "flip_lr", "flip_ud", "transpose", "anti_transpose")


def dihedral(grid: Grid, k: int) -> Grid:
    return tuple(map(tuple, _DIHEDRAL[k](np.asarray(grid)).tolist()))


@dataclass(frozen=True)
class View:
    """`colours[c]` is the colour that c becomes; `order[i]` is the original index of the i-th shown demonstration
    (empty order = the original order)."""

    dihedral: int = 0
    colours: tuple[int, ...] = IDENTITY_COLOURS
    order: tuple[int, ...] = field(default=())

    def __post_init__(self) -> None:
        if not 0 <= self.dihedral < 8:
            raise ValueError(f"view.dihedral must be 0..7, got {self.dihedral}")
        if sorted(self.colours) != list(IDENTITY_COLOURS):
            raise ValueError(f"view.colours must permute 0..9, got {self.colours}")
        if self.order and sorted(self.order) != list(range(len(self.order))):
            raise ValueError(f"view.order must permute the demonstrations, got {self.order}")

    @property
    def is_identity(self) -> bool:
        return self.dihedral == 0 and self.colours == IDENTITY_COLOURS and self.order == tuple(range(len(self.order)))

    def apply_grid(self, grid: Grid) -> Grid:
        lut = np.asarray(self.colours)
        return tuple(map(tuple, lut[_DIHEDRAL[self.dihedral](np.asarray(grid))].tolist()))

    def invert_grid(self, grid: Grid) -> Grid:
        inverse = np.argsort(self.colours)
        return tuple(map(tuple, _DIHEDRAL[_DIHEDRAL_INVERSE[self.dihedral]](inverse[np.asarray(grid)]).tolist()))

    def apply(self, task: Task) -> Task:
        order = self.order or tuple(range(len(task.train)))
        if len(order) != len(task.train):
            raise ValueError(f"view.order has {len(order)} entries, task {task.id} has {len(task.train)} demonstrations")
        train = tuple(Pair(self.apply_grid(task.train[i].input), self.apply_grid(task.train[i].output)) for i in order)
        labels = tuple(map(self.apply_grid, task.test_outputs)) if task.test_outputs is not None else None
        return Task(task.id, train, tuple(map(self.apply_grid, task.test_inputs)), labels)

    def invert(self, task: Task) -> Task:
        """The original task back from its view (used by tests; answers only need `invert_grid`)."""
        order = self.order or tuple(range(len(task.train)))
        undo = View(_DIHEDRAL_INVERSE[self.dihedral], tuple(np.argsort(self.colours).tolist()))
        train = [Pair(undo.apply_grid(p.input), undo.apply_grid(p.output)) for p in task.train]
        original = [train[order.index(i)] for i in range(len(order))]
        labels = tuple(map(undo.apply_grid, task.test_outputs)) if task.test_outputs is not None else None
        return Task(task.id, tuple(original), tuple(map(undo.apply_grid, task.test_inputs)), labels)

    def to_json(self) -> dict:
        return {"dihedral": self.dihedral, "colours": list(self.colours), "order": list(self.order)}

    @classmethod
    def from_json(cls, raw: dict) -> View:
        return cls(raw.get("dihedral", 0), tuple(raw.get("colours", IDENTITY_COLOURS)), tuple(raw.get("order", ())))


def colour_permutation(rng: random.Random, keep_zero: bool = True) -> tuple[int, ...]:
    """A random permutation of the colours; keep_zero leaves black (usually the background) in place."""
    moving = list(range(1 if keep_zero else 0, COLOURS))
    shuffled = moving[:]
    rng.shuffle(shuffled)
    perm = list(IDENTITY_COLOURS)
    for src, dst in zip(moving, shuffled):
        perm[src] = dst
    return tuple(perm)


def random_view(rng: random.Random, n_train: int, keep_zero: bool = True) -> View:
    order = list(range(n_train))
    rng.shuffle(order)
    return View(rng.randrange(8), colour_permutation(rng, keep_zero), tuple(order))


def reordered(n_train: int, shift: int = 1) -> View:
    """Demonstrations rotated by `shift` places (for n > 1): the second-attempt view of SPEC section 5."""
    return View(order=tuple((i + shift) % n_train for i in range(n_train)))
