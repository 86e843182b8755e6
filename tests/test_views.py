"""Views: every dihedral transform, colour permutation and demonstration order inverts exactly."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from submission.grids import to_grid
from submission.tasks import load_tasks
from submission.views import View, colour_permutation, dihedral, random_view, reordered

grids = st.integers(1, 30).flatmap(lambda h: st.integers(1, 30).flatmap(
    lambda w: st.lists(st.lists(st.integers(0, 9), min_size=w, max_size=w), min_size=h, max_size=h))).map(to_grid)
views = st.builds(View, st.integers(0, 7), st.permutations(range(10)).map(tuple))


@settings(max_examples=300, deadline=None)
@given(grids, views)
def test_inverse_of_view_is_identity(grid, view):
    assert view.invert_grid(view.apply_grid(grid)) == grid


@settings(max_examples=100, deadline=None)
@given(grids)
def test_eight_distinct_dihedral_images_of_an_asymmetric_grid(grid):
    images = {dihedral(grid, k) for k in range(8)}
    assert len(images) in (1, 2, 4, 8)  # the orbit size divides the group order


def test_dihedral_matches_hand_made_examples():
    g = ((1, 2, 3), (4, 5, 6))
    assert dihedral(g, 1) == ((3, 6), (2, 5), (1, 4))  # rot90 counter-clockwise
    assert dihedral(g, 2) == ((6, 5, 4), (3, 2, 1))
    assert dihedral(g, 4) == ((3, 2, 1), (6, 5, 4))
    assert dihedral(g, 5) == ((4, 5, 6), (1, 2, 3))
    assert dihedral(g, 6) == ((1, 4), (2, 5), (3, 6))
    assert dihedral(g, 7) == ((6, 3), (5, 2), (4, 1))


@pytest.mark.parametrize("keep_zero", [True, False])
def test_colour_permutations(keep_zero):
    rng = random.Random(0)
    perms = {colour_permutation(rng, keep_zero) for _ in range(50)}
    assert all(sorted(p) == list(range(10)) for p in perms) and len(perms) > 40
    assert all(p[0] == 0 for p in perms) == keep_zero


def test_task_views_invert_on_real_tasks(arc_data):
    rng = random.Random(1)
    for task in load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks[:40]:
        view = random_view(rng, len(task.train), keep_zero=False)
        shown = view.apply(task)
        assert view.invert(shown) == task
        assert [view.invert_grid(g) for g in shown.test_outputs] == list(task.test_outputs)


def test_reordered_view_moves_demonstrations():
    view = reordered(3)
    assert view.order == (1, 2, 0) and not view.is_identity and View().is_identity


def test_bad_views_are_refused():
    with pytest.raises(ValueError, match="dihedral"):
        View(8)
    with pytest.raises(ValueError, match="colours"):
        View(0, (0,) * 10)
