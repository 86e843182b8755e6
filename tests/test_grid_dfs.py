"""The grid line's depth-first search against brute force on a tiny model with the 16-token vocabulary.

The model is build.models.tiny's random Qwen3 cut by build.models.grid_vocab, its output head scaled up so that it is
confident enough for several answers to clear the cut-off. The grammar is bounded to 2x2 grids, so brute force can score
every legal answer (10,210 of them) with plain full forward passes, no cache; the search must return exactly those
at or above the cut-off, with the same log-probabilities, running the prompt once, alone and with views in lockstep
(`search_batch`, `search.dfs_batch`), which must also find on real ARC task views what the search finds view by view.
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
    from build.models.grid_vocab import cut
    from build.models.tiny import make_checkpoint
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

    def prefill(self, ids, guess=()):
        self.prefills += 1
        return self.inner.prefill(ids, guess)

    def push(self, token):
        self.pushes += 1
        return self.inner.push(token)

    def truncate(self, length):
        self.inner.truncate(length)


class CountingBatchStepper:
    def __init__(self, inner):
        self.inner, self.prefills, self.pushes = inner, 0, 0

    def prefill(self, prompts, guesses=None):
        self.prefills += 1
        return self.inner.prefill(prompts, guesses)

    def push(self, moves):
        self.pushes += 1
        return self.inner.push(moves)


DEMOS = (Pair(((1, 2), (3, 4)), ((4, 3), (2, 1))), Pair(((5,),), ((5,),)))


@pytest.fixture(scope="module")
def truth(model):
    prompt = encode(DEMOS, ((7, 0), (0, 7))).ids
    return prompt, _brute_force(model, prompt)


@pytest.mark.parametrize("dfs_batch", [1, 2])
def test_search_finds_exactly_the_answers_brute_force_finds(model, truth, dfs_batch):
    """Alone, and in lockstep beside a second view (a longer prompt: the batch is padded) with the cache compacted
    every few steps: the same answers, scored as brute force scores them, the prompt run once."""
    from submission.grid.dfs import search_batch
    from submission.grid.model import HFBatchStepper, HFStepper

    prompt, truth = truth
    expected = {a: s for a, s in truth.items() if s >= math.log(CUTOFF)}
    if dfs_batch == 1:
        stepper = CountingStepper(HFStepper(model))
        result = search(stepper, prompt, CUTOFF, MAX_SIDE)
        model_calls = result.steps
    else:
        other = encode(DEMOS[::-1], ((1, 1, 1), (2, 2, 2))).ids
        assert len(other) > len(prompt)
        stepper = CountingBatchStepper(HFBatchStepper(model, slack=2))
        result, beside = search_batch(stepper, [prompt, other], CUTOFF, MAX_SIDE)
        assert beside.complete and beside.steps > 0
        model_calls = max(result.steps, beside.steps)  # one call per step for both views
    found = {f.tokens: f.logp for f in result.found}
    assert result.complete and len(expected) >= 3, sorted(truth.values())[-5:]
    assert set(found) == set(expected)
    for answer, logp in found.items():
        assert logp == pytest.approx(expected[answer], abs=1e-4)
    assert [f.logp for f in result.found] == sorted(found.values(), reverse=True)
    # the prompt ran once; every other model call was one token per view on the shared cache
    assert stepper.prefills == 1 and stepper.pushes == model_calls
    # far fewer tokens than brute force scored (and than re-running the prompt per branch would)
    assert result.steps < len(truth) / 10


def test_greedy_scores_as_brute_force_does(model, truth):
    """The greedy fallback: a legal answer; probabilities under the legal-token distribution sum to 1."""
    from submission.grid.model import HFStepper

    prompt, truth = truth
    best = greedy(HFStepper(model), prompt, MAX_SIDE)
    assert best.tokens in truth and best.logp == pytest.approx(truth[best.tokens], abs=1e-4)
    assert sum(math.exp(s) for s in truth.values()) == pytest.approx(1.0, abs=1e-3)


@pytest.mark.parametrize("together", [False, True])
def test_views_searched_in_lockstep_find_what_each_view_finds_alone(model, arc_data, together):
    """The 16 views of a real ARC-AGI-2 test input (two prompt lengths: the batch is padded), searched one by one
    and in groups of 4 and 16: the same answers with the same log-probabilities (float32, up to the rounding of
    batched matrix products), the same steps; views finish at different steps (their rows leave the batch), and the
    masked slots of abandoned branches are compacted away, so the cache stays within the longest row + slack."""
    from submission.grid.dfs import search_batch
    from submission.grid.model import HFBatchStepper, HFStepper
    from submission.grid.queue import task_cost
    from submission.grid.rescore import search_views
    from submission.tasks import load_tasks

    task = min(load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks, key=task_cost)
    prompts = [encode(shown.train, shown.test_inputs[0], max_len=4096).ids
               for shown in (view.apply(task) for view in search_views(task, 8, 2, seed=0))]
    assert len(prompts) == 16 and len({len(p) for p in prompts}) == 2
    alone = [search(HFStepper(model), prompt, CUTOFF, MAX_SIDE) for prompt in prompts]
    assert sum(len(r.found) for r in alone) >= 16 and len({r.steps for r in alone}) > 1
    for group in (4, 16):
        together_results = []
        for at in range(0, 16, group):
            stepper = HFBatchStepper(model, together, slack=3)
            together_results += search_batch(stepper, prompts[at:at + group], CUTOFF, MAX_SIDE)
            deepest = max(len(p) for p in prompts[at:at + group]) + 2 * (MAX_SIDE + 1)
            assert stepper.cache.get_seq_length() <= deepest + 3
        for one, many in zip(alone, together_results):
            assert [f.tokens for f in many.found] == [f.tokens for f in one.found]
            assert [f.logp for f in many.found] == pytest.approx([f.logp for f in one.found], abs=1e-4)
            assert (many.steps, many.complete) == (one.steps, True)


def test_search_stops_at_its_deadline(model):
    from submission.grid.model import HFStepper

    prompt = encode((Pair(((1,),), ((2,),)),), ((3,),)).ids
    ticks = iter(range(10_000))
    result = search(HFStepper(model), prompt, 1e-6, MAX_SIDE, deadline=5, clock=lambda: next(ticks))
    assert not result.complete and result.steps <= 6


def test_views_in_lockstep_stop_at_their_deadline(model):
    from submission.grid.dfs import search_batch
    from submission.grid.model import HFBatchStepper

    prompts = [encode((Pair(((1,),), ((2,),)),), ((3,),)).ids, encode((Pair(((1, 1),), ((2,),)),), ((3,),)).ids]
    ticks = iter(range(10_000))
    results = search_batch(HFBatchStepper(model), prompts, 1e-6, MAX_SIDE, deadline=5, clock=lambda: next(ticks))
    assert [r.complete for r in results] == [False, False] and all(r.steps <= 5 for r in results)


def test_lockstep_refuses_sliding_window_layers():
    """A sliding-window layer drops cache slots by position, which the masked rows of lockstep do not follow."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from submission.grid.model import HFBatchStepper

    config = Qwen3Config(vocab_size=16, hidden_size=32, intermediate_size=32, num_hidden_layers=2,
                         num_attention_heads=2, num_key_value_heads=1, head_dim=16, use_sliding_window=True,
                         sliding_window=8, max_window_layers=1)
    with pytest.raises(ValueError, match="dfs_batch > 1 needs full attention in every layer"):
        HFBatchStepper(Qwen3ForCausalLM(config))


def test_cut_off_must_be_a_probability(model):
    from submission.grid.dfs import search_batch

    with pytest.raises(ValueError, match="cut-off"):
        search(None, [0], 0.0)
    with pytest.raises(ValueError, match="cut-off"):
        search_batch(None, [[0]], 1.5)


def test_a_guess_must_be_an_answer():
    """A guess is a found answer's tokens (<eos> last): anything else is a caller's mistake, refused by name."""
    with pytest.raises(ValueError, match="guess is an answer"):
        search(None, [0], 0.2, guess=(1, 2))


def test_newline_and_end_only_where_the_grammar_allows():
    assert NEWLINE not in GridState().legal(MAX_SIDE) and EOS not in GridState().legal(MAX_SIDE)


@pytest.mark.parametrize("dfs_batch, together", [(1, False), (1, True), (2, False), (2, True)])
def test_a_seeded_search_finds_the_same_answers_with_fewer_model_calls(model, truth, dfs_batch, together):
    """ARChitects' pass_guess: the best answer so far, run with the prompt in one prefill and walked first, leaves
    the answers and their scores as they were and saves the model calls of its path. Seeded with the best answer,
    with one that clears the cut-off further down, and with one that does not (the walk leaves it where it falls
    below the cut-off): the same answers each time; view by view (the prompt preloaded or not) and in lockstep (the
    prompts prefilled together or one by one)."""
    from submission.grid.dfs import search_batch
    from submission.grid.model import HFBatchStepper, HFStepper

    prompt, truth = truth
    plain = search(HFStepper(model), prompt, CUTOFF, MAX_SIDE)
    below = max((a for a, s in truth.items() if s < math.log(CUTOFF)), key=len)
    for guess in (plain.found[0].tokens, plain.found[-1].tokens, below):
        if dfs_batch == 1:
            stepper = CountingStepper(HFStepper(model))
            if together:
                stepper.inner.preload([prompt])
            seeded = search(stepper, prompt, CUTOFF, MAX_SIDE, guess=guess)
        else:
            stepper = CountingBatchStepper(HFBatchStepper(model, together, slack=2))
            seeded, beside = search_batch(stepper, [prompt, prompt], CUTOFF, MAX_SIDE, guesses=[guess, ()])
            assert [f.tokens for f in beside.found] == [f.tokens for f in plain.found]
        assert seeded.complete and stepper.prefills == 1
        assert [f.tokens for f in seeded.found] == [f.tokens for f in plain.found]
        assert [f.logp for f in seeded.found] == pytest.approx([f.logp for f in plain.found], abs=1e-4)
        if guess != below:  # its path, <eos> aside, came with the prefill
            assert seeded.steps == plain.steps - (len(guess) - 1)
        else:
            assert seeded.steps <= plain.steps


def test_the_search_cache_is_written_in_place_not_copied_per_token(model):
    """transformers' DynamicLayer appends with torch.cat: a copy of the whole cache per token and layer. The
    search's cache keeps one buffer per layer through pushes and crops, up to its room."""
    from submission.grid.model import HFStepper

    stepper = HFStepper(model, room=8)
    prompt = encode(DEMOS, ((7, 0), (0, 7))).ids
    stepper.prefill(prompt)
    first = [layer.keys.data_ptr() for layer in stepper.cache.layers]
    for token in (3, 4, NEWLINE, 5):
        stepper.push(token)
    stepper.truncate(len(prompt) + 1)
    lengths = {layer.keys.shape[-2] for layer in stepper.cache.layers}
    for token in (6, NEWLINE):
        stepper.push(token)
    assert lengths == {len(prompt) + 1} and stepper.length == len(prompt) + 3
    assert [layer.keys.data_ptr() for layer in stepper.cache.layers] == first
    for token in (1,) * 8:  # past its room the buffer grows, and the answer is still exact
        logp = stepper.push(token)
    assert np.allclose(logp, HFStepper(model).prefill([*prompt, 3, 6, NEWLINE, *(1,) * 8])[0], atol=1e-5)


def test_lockstep_steps_attend_without_copying_the_cache(model, monkeypatch):
    """Issue 45: with a mask (the rows' padded and abandoned slots) transformers' SDPA path repeats every KV head for
    grouped-query attention, a copy of the whole cache per layer per step. The lockstep's decode steps attend through
    grouped_decode_attention instead: no repeat_kv call, the same log-probabilities as each row alone, and the
    model's own attention implementation untouched outside the step."""
    import transformers.integrations.sdpa_attention as sdpa_attention

    from submission.grid.model import HFBatchStepper, HFStepper

    assert model.config.num_attention_heads > model.config.num_key_value_heads  # grouped-query attention
    calls: list[int] = []
    real = sdpa_attention.repeat_kv
    monkeypatch.setattr(sdpa_attention, "repeat_kv", lambda x, n: calls.append(n) or real(x, n))
    prompts = [encode(DEMOS, ((7, 0), (0, 7))).ids, encode(DEMOS, ((7,),)).ids]  # unequal lengths: a mask
    moves = [[(0, len(prompts[0]), 3), (1, len(prompts[1]), 4)], [(0, len(prompts[0]) + 1, NEWLINE), (1, len(
        prompts[1]), 5)], [(0, len(prompts[0]) + 2, 6), (1, len(prompts[1]) + 1, NEWLINE)]]  # row 1 goes back once
    steps = {}
    for grouped in (True, False):
        stepper = HFBatchStepper(model, grouped=grouped)
        stepper.prefill(prompts)
        del calls[:]
        steps[grouped] = [stepper.push(m) for m in moves]
        assert (len(calls) == 0) == grouped and model.config._attn_implementation == "sdpa"
    alone = []
    for row, prompt in enumerate(prompts):
        single = HFStepper(model)
        single.prefill(prompt)
        for step in moves:
            _, length, token = step[row]
            single.truncate(length)
            alone.append(single.push(token))
    for grouped in (True, False):
        by_row = [steps[grouped][i][row] for row in range(2) for i in range(3)]
        assert np.allclose(by_row, alone, atol=1e-4)
