"""Views for the search and the rescoring, and the choice of the two attempts (SPEC section 10).

The search runs each test input under 16 views (8 dihedral transforms x 2 colour permutations, the first the
identity); every answer it finds is mapped back to the original frame, so one grid found in several views counts
several `hits`. Each distinct grid is then scored under 8 fresh views (one per dihedral transform, each with its own
permutation of all ten colours and demonstration order, seeded by the task id): `nll` is the mean over those views
of the grid's summed negative log-likelihood (nats, its <eos> included). A grid the model likes in every frame is
more likely right than one it found by chance in one. score = hits - nll, in float32; the top two are the
attempts. All of this is pure: the likelihood comes in as a function.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from submission.grid.format import KIT16, GridFormat, answer_ids, encode
from submission.grids import EMPTY_ANSWER, Grid, to_grid, to_json
from submission.tasks import Task
from submission.views import IDENTITY_COLOURS, View, colour_permutation


@dataclass(frozen=True)
class Candidate:
    grid: Grid  # in the task's own frame
    hits: int  # search views that found it
    nll: float  # mean over the rescoring views

    @property
    def score(self) -> float:
        return float(np.float32(self.hits) - np.float32(self.nll))

    def to_json(self) -> dict:
        return {"grid": to_json(self.grid), "hits": self.hits, "nll": self.nll, "score": self.score}

    @classmethod
    def from_json(cls, raw: dict) -> Candidate:
        return cls(to_grid(raw["grid"]), int(raw["hits"]), float(raw["nll"]))


@dataclass(frozen=True)
class Rescored:
    candidates: tuple[Candidate, ...]  # best first
    complete: bool  # every view scored every candidate before the deadline


def _rng(task_id: str, seed: int, purpose: str) -> random.Random:
    return random.Random(f"{purpose}:{seed}:{task_id}")


def search_views(task: Task, dihedrals: int = 8, colour_perms: int = 2, seed: int = 0) -> list[View]:
    """`dihedrals` x `colour_perms` views; the first colour permutation is the identity, the others permute all ten
    colours; demonstrations are shuffled in every view but the plain one."""
    rng = _rng(task.id, seed, "search")
    perms = [IDENTITY_COLOURS] + [colour_permutation(rng, keep_zero=False) for _ in range(colour_perms - 1)]
    views = []
    for colours in perms:
        for k in range(dihedrals):
            order = list(range(len(task.train)))
            if k or colours != IDENTITY_COLOURS:
                rng.shuffle(order)
            views.append(View(k, colours, tuple(order)))
    return views


def rescoring_views(task: Task, count: int = 8, seed: int = 0) -> list[View]:
    """Fresh views: dihedral transform i % 8, a permutation of all ten colours and an order each, seeded per task."""
    rng = _rng(task.id, seed, "rescore")
    views = []
    for i in range(count):
        order = list(range(len(task.train)))
        rng.shuffle(order)
        views.append(View(i % 8, colour_permutation(rng, keep_zero=False), tuple(order)))
    return views


# [(token ids, answer length), ...] -> the summed NLL of each item's last tokens: one model call for them all
NLLs = Callable[[Sequence[tuple[Sequence[int], int]]], Sequence[float]]


def rescore(task: Task, test_index: int, hits: dict[Grid, int], views: Sequence[View], nlls: NLLs,
            max_len: int, deadline: float = math.inf, clock: Callable[[], float] = lambda: 0.0,
            batch: int = 1, fmt: GridFormat = KIT16) -> Rescored:
    """Each found grid with its hits and its mean NLL under `views`, best first. Whole views at a time, every
    candidate in each: as many views per model call as `batch` sequences hold (at least one view; batch 1 = one
    sequence per call). The deadline is checked before each call; at the deadline the views finished so far are
    the mean for every candidate alike (none: nll 0), and the result is not `complete`."""
    grids = list(hits)
    if not grids:
        return Rescored((), True)
    totals = np.zeros(len(grids), np.float32)
    done = 0
    per_call = max(1, batch // max(len(grids), 1))
    for first in range(0, len(views), per_call):
        items = []
        for view in views[first:first + per_call]:
            shown = view.apply(task)
            for grid in grids:
                answer = view.apply_grid(grid)
                encoded = encode(shown.train, shown.test_inputs[test_index], answer, max_len, fmt)
                items.append((encoded.ids, len(answer_ids(answer, fmt))))
        scores = []
        for start in range(0, len(items), max(batch, 1)):
            if clock() >= deadline:
                break  # the deadline cut these views short: they do not count
            scores += [np.float32(v) for v in nlls(items[start:start + max(batch, 1)])]
        if len(scores) < len(items):
            break
        for view_scores in np.array(scores, np.float32).reshape(-1, len(grids)):
            totals += view_scores
            done += 1
    ranked = rank([Candidate(g, hits[g], float(t / np.float32(max(done, 1)))) for g, t in zip(grids, totals)])
    return Rescored(tuple(ranked), done == len(views))


def rank(candidates: Sequence[Candidate]) -> list[Candidate]:
    """Best first: highest score, then most hits, then the grid itself (a stable order for equal scores)."""
    return sorted(candidates, key=lambda c: (-c.score, -c.hits, c.grid))


def choose(candidates: Sequence[Candidate]) -> tuple[Grid, Grid]:
    """The two attempts: the two best distinct grids; the second repeats the first when there is one, [[0]] twice
    when there is none."""
    ranked = rank(candidates)
    if not ranked:
        return EMPTY_ANSWER, EMPTY_ANSWER
    return ranked[0].grid, ranked[1].grid if len(ranked) > 1 else ranked[0].grid
