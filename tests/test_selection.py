"""Answer selection (SPEC section 4) on hand-made candidate lists."""

from __future__ import annotations

from submission.grids import EMPTY_ANSWER
from submission.selection import Candidate, Source, rank, select

A, B, C, D = ((1,),), ((2,),), ((3,),), ((4,),)
G, P, T = Source.GRID, Source.PROGRAM, Source.TRANSFERRED


def cands(*pairs):
    return [Candidate(grid, source, i) for i, (grid, source) in enumerate(pairs)]


def test_empty_and_single_fill_with_zero_grid():
    assert select([]) == (EMPTY_ANSWER, EMPTY_ANSWER)
    assert select(cands((A, G))) == (A, EMPTY_ANSWER)


def test_two_votes_beat_a_program():
    assert select(cands((A, G), (B, P), (A, G))) == (A, B)


def test_program_beats_single_grids():
    assert select(cands((A, G), (B, G), (C, P))) == (C, A)


def test_grids_by_votes_then_first_seen():
    assert select(cands((A, G), (B, G), (B, G), (C, G), (C, G), (C, G))) == (C, B)
    assert select(cands((A, G), (B, G))) == (A, B)


def test_program_and_grid_agreeing_vote_together():
    ranked = rank(cands((A, G), (B, G), (B, P)))
    assert ranked[0].grid == B and ranked[0].votes == 2 and ranked[0].from_program


def test_transferred_votes_when_no_own_program():
    assert select(cands((A, G), (B, G), (B, T))) == (B, A)
    ranked = rank(cands((A, G), (B, G), (B, T)))
    assert ranked[0].votes == 2


def test_transferred_outputs_stand_in_for_program_outputs():
    # SPEC 4: they "replace the program outputs of an input that has no train-perfect program of its own": the program
    # tier, ahead of single-vote grids. Read as plain grids, this would select (A, B) instead.
    assert select(cands((A, G), (B, G), (C, T))) == (C, A)
    assert select(cands((A, G), (C, T))) == (C, A)
    assert rank(cands((A, G), (C, T)))[0].from_program
    # two votes still come first; a transferred output never outranks a grid with two votes
    assert select(cands((A, G), (A, G), (C, T))) == (A, C)


def test_transferred_ranks_after_grids_when_own_program():
    # With its own program, the input's grids come before any transferred output, which does not vote.
    assert select(cands((A, P), (B, G), (C, T), (C, T))) == (A, B)
    assert [r.grid for r in rank(cands((A, P), (B, G), (C, T)))] == [A, B, C]


def test_duplicates_never_fill_both_attempts():
    first, second = select(cands((A, G), (A, G), (A, P)))
    assert first == A and second == EMPTY_ANSWER


def test_the_weak_pool_only_fills_empty_slots():
    """Algorithm 7 line 16: programs that ran with a valid test output but are not candidates join the weak pool. It
    does not vote and ranks after every candidate, so it replaces only the `[[0]]` filler."""
    W = Source.WEAK
    assert select(cands((A, G), (B, W))) == (A, B)  # fills the empty second slot
    assert select(cands((B, W), (C, W))) == (B, C)  # an agent with no grid: its weak outputs, in order
    assert select(cands((A, G), (C, G), (B, W), (B, W))) == (A, C)  # never ahead of a grid, whatever its count
    assert select(cands((A, G), (C, T), (B, W))) == (C, A)  # nor of a transferred output
    assert select(cands((A, P), (C, T), (B, W))) == (A, C)  # nor of a late transferred output
    assert select(cands((A, G), (A, W))) == (A, EMPTY_ANSWER)  # no vote: a weak copy of a grid adds nothing
