"""solve_task's schedule around the search (issue 29): search batches taken in turn across a task's test inputs,
every view seeded with its input's best answer so far, and `complete` only when the search and the rescoring both
finished. The search and the likelihoods are fakes (recorded calls; a clock that moves only when a fake says so), so
no model runs."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from submission.grid.profile import GridProfile  # noqa: E402
from submission.grid.dfs import Found, SearchResult  # noqa: E402
from submission.grid.format import EOS, encode, grid_ids  # noqa: E402
from submission.grid.rescore import search_views  # noqa: E402
from submission.grid.solve import solve_task  # noqa: E402
from submission.grid.ttt import TTTReport  # noqa: E402
from submission.tasks import Pair, Task  # noqa: E402

TASK = Task("solve", (Pair(((1, 2),), ((2, 1),)), Pair(((3, 4), (5, 6)), ((6, 5), (4, 3)))), (((7, 8),), ((9,),)))
ANSWERS = (((8, 7),), ((9,),))
MAX_LEN = 4096


class FakeAdapter:
    model = torch.nn.Linear(1, 1)

    def reset(self):
        pass

    def train(self, sequences, deadline, clock, log=None):
        return TTTReport(0, 0, (), 0.0)


def _solve(monkeypatch, nll_s: float = 0.0):
    """solve_task with a search that finds each input's answer in every view, recording (input, view, guess) per
    call, and likelihoods that take `nll_s` each."""
    profile = GridProfile()
    prompt_len = MAX_LEN - profile.run.answer_room
    views = search_views(TASK, 8, 2, profile.rescore.seed)
    which = {tuple(encode(view.apply(TASK).train, view.apply(TASK).test_inputs[i], max_len=prompt_len).ids): (i, view)
             for i in range(2) for view in views}
    now, calls = [0.0], []

    def fake_search(stepper, prompt, cutoff, max_side, deadline, clock, guess=(), fmt=None):
        index, view = which[tuple(prompt)]
        calls.append((index, view, tuple(guess)))
        return SearchResult((Found((*grid_ids(view.apply_grid(ANSWERS[index])), EOS), -0.1),), True, 3)

    def fake_nlls(model, items):
        now[0] += nll_s
        return [1.0] * len(items)

    monkeypatch.setattr("submission.grid.solve.search", fake_search)
    monkeypatch.setattr("submission.grid.model.answer_nlls", fake_nlls)
    return solve_task(FakeAdapter(), TASK, profile, MAX_LEN, 100.0, clock=lambda: now[0]), calls


def test_search_batches_alternate_between_test_inputs_seeded_with_the_best_answer(monkeypatch):
    """NVARC's order: each input has half its 16 views searched before either has the rest (here batch by batch of
    4), so a deadline leaves every input an answer; every view after an input's first is seeded with that input's
    best answer, mapped into the view."""
    outcome, calls = _solve(monkeypatch)
    assert [index for index, _, _ in calls] == [i for _ in range(4) for i in (0, 1) for _ in range(4)]
    seen: set[int] = set()
    for index, view, guess in calls:
        assert guess == ((*grid_ids(view.apply_grid(ANSWERS[index])), EOS) if index in seen else ())
        seen.add(index)
    assert [c[0].grid for c in outcome.candidates] == list(ANSWERS) and outcome.complete
    assert [c[0].hits for c in outcome.candidates] == [16, 16] and outcome.search_steps == 32 * 3


def test_a_rescoring_cut_by_the_deadline_leaves_the_task_incomplete(monkeypatch):
    """Each input's rescoring has half the 100 s; at 30 s a view it scores two of its eight views: the answers stand,
    ranked on those views, but the outcome must not claim a finished task."""
    outcome, _ = _solve(monkeypatch, nll_s=30.0)
    assert [c[0].grid for c in outcome.candidates] == list(ANSWERS)
    assert not outcome.complete
