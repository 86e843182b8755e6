"""The grid line's depth-first search against brute force on a tiny model with the 16-token vocabulary.

The model is build.tiny's random Qwen3 cut by build.grid_vocab, its output head scaled up so that it is confident
enough for several answers to clear the cut-off. The grammar is bounded to 2x2 grids, so brute force can score
every legal answer (10,210 of them) with plain full forward passes, no cache; the search must return exactly those
at or above the cut-off, with the same log-probabilities, running the prompt once.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from submission.grid.dfs import greedy, search  # noqa: E402
from submission.grid.format import EOS, NEWLINE, GridState, encode, grid_ids  # noqa: E402
from submission.tasks import Pair  # noqa: E402

MAX_SIDE = 2
CUTOFF = 0.02


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from build.grid_vocab import cut
    from build.tiny import make_checkpoint
    from submission.grid.model import load_model

    root = tmp_path_factory.mktemp("grid-dfs")
    grid_dir = cut(make_checkpoint(root / "base", "qwen3", seed=3), root / "grid")
    model = load_model(grid_dir, "float32")
    with torch.no_grad():
        model.lm_head.weight.mul_(25.0)  # a confident model: several answers clear the cut-off
    return model


def _all_answers() -> list[tuple[int, ...]]:
    out = []
    for rows in range(1, MAX_SIDE + 1):
        for cols in range(1, MAX_SIDE + 1):
            for cells in np.ndindex(*([10] * (rows * cols))):
                grid = tuple(tuple(cells[r * cols:(r + 1) * cols]) for r in range(rows))
                out.append((*grid_ids(grid), EOS))
    return out


def _brute_force(model, prompt: tuple[int, ...]) -> dict[tuple[int, ...], float]:
    """Every legal answer's log-probability under the legal-token distribution, each next-token distribution from
    a full forward pass of prompt + prefix (no cache). A forced token (one legal choice) has log-probability 0,
    and each distinct prefix is run once, which keeps this to ~1,300 passes instead of ~70,000."""
    answers = _all_answers()
    assert len(answers) == 10 + 100 + 100 + 10_000
    needed: dict[tuple[int, ...], list[int]] = {}
    for answer in answers:
        state = GridState()
        for step, token in enumerate(answer):
            legal = state.legal(MAX_SIDE)
            if len(legal) > 1:
                needed[answer[:step]] = list(legal)
            state = state.advance(token)
    dist: dict[tuple[int, ...], np.ndarray] = {}
    by_length: dict[int, list[tuple[int, ...]]] = {}
    for prefix in needed:
        by_length.setdefault(len(prefix), []).append(prefix)
    for prefixes in by_length.values():
        ids = torch.tensor([list(prompt) + list(p) for p in prefixes])
        with torch.no_grad():
            logp = torch.log_softmax(model(input_ids=ids).logits[:, -1].float(), -1).numpy()
        for prefix, row in zip(prefixes, logp):
            legal = needed[prefix]
            dist[prefix] = row - np.logaddexp.reduce(row[legal])
    scores = {}
    for answer in answers:
        total = np.float32(0)
        for step, token in enumerate(answer):
            if answer[:step] in dist:
                total += np.float32(dist[answer[:step]][token])
        scores[answer] = float(total)
    return scores


class CountingStepper:
    def __init__(self, inner):
        self.inner, self.prefills, self.pushes = inner, 0, 0

    @property
    def length(self):
        return self.inner.length

    def prefill(self, ids):
        self.prefills += 1
        return self.inner.prefill(ids)

    def push(self, token):
        self.pushes += 1
        return self.inner.push(token)

    def truncate(self, length):
        self.inner.truncate(length)


def test_search_finds_exactly_the_answers_brute_force_finds(model):
    from submission.grid.model import HFStepper

    demos = (Pair(((1, 2), (3, 4)), ((4, 3), (2, 1))), Pair(((5,),), ((5,),)))
    prompt = encode(demos, ((7, 0), (0, 7))).ids
    truth = _brute_force(model, prompt)
    expected = {a: s for a, s in truth.items() if s >= math.log(CUTOFF)}
    stepper = CountingStepper(HFStepper(model))
    result = search(stepper, prompt, CUTOFF, MAX_SIDE)
    found = {f.tokens: f.logp for f in result.found}
    assert result.complete and len(expected) >= 3, sorted(truth.values())[-5:]
    assert set(found) == set(expected)
    for answer, logp in found.items():
        assert logp == pytest.approx(expected[answer], abs=1e-4)
    assert [f.logp for f in result.found] == sorted(found.values(), reverse=True)
    # the prompt ran once; every other model call was one token on the shared cache
    assert stepper.prefills == 1 and stepper.pushes == result.steps
    # far fewer tokens than brute force scored (and than re-running the prompt per branch would)
    assert result.steps < len(truth) / 10
    # the greedy fallback: a legal answer, scored as brute force scores it
    best = greedy(HFStepper(model), prompt, MAX_SIDE)
    assert best.tokens in truth and best.logp == pytest.approx(truth[best.tokens], abs=1e-4)
    # probabilities under the legal-token distribution sum to 1: what the search found is part of it
    assert sum(math.exp(s) for s in truth.values()) == pytest.approx(1.0, abs=1e-3)


def test_search_stops_at_its_deadline(model):
    from submission.grid.model import HFStepper

    prompt = encode((Pair(((1,),), ((2,),)),), ((3,),)).ids
    ticks = iter(range(10_000))
    result = search(HFStepper(model), prompt, 1e-6, MAX_SIDE, deadline=5, clock=lambda: next(ticks))
    assert not result.complete and result.steps <= 6


def test_cut_off_must_be_a_probability(model):
    with pytest.raises(ValueError, match="cut-off"):
        search(None, [0], 0.0)


def test_newline_and_end_only_where_the_grammar_allows():
    assert NEWLINE not in GridState().legal(MAX_SIDE) and EOS not in GridState().legal(MAX_SIDE)
