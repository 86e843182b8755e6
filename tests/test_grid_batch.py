"""Batched rescoring: several views' sequences in one model call give the NLLs (and the ranking) of one call per
sequence; the deadline still counts whole views only."""

from __future__ import annotations

import pytest

from submission.grid.queue import task_cost
from submission.grid.rescore import rescore, rescoring_views
from submission.tasks import load_tasks

pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from build.models.grid_vocab import cut
    from build.models.tiny import make_checkpoint
    from submission.grid.model import load_model

    root = tmp_path_factory.mktemp("grid-batch")
    return load_model(cut(make_checkpoint(root / "base", "qwen3", seed=5), root / "grid"), "float32")


@pytest.fixture(scope="module")
def task(arc_data):
    return min(load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks, key=task_cost)


def test_batched_rescoring_equals_one_sequence_per_call(model, task):
    from submission.grid.model import answer_nlls

    label = task.test_outputs[0]
    # three candidates of different sizes: the batch is padded to the longest sequence
    hits = {label: 2, ((1, 2), (3, 4)): 1, tuple(tuple((c + 1) % 10 for c in row) for row in label) + (label[0],): 1}
    views = rescoring_views(task, 4, seed=0)
    calls = []

    def nlls(items):
        calls.append(len(items))
        return answer_nlls(model, items)

    alone = rescore(task, 0, hits, views, lambda items: [answer_nlls(model, [i])[0] for i in items], 4096).candidates
    for batch, sizes in ((12, [12]), (8, [6, 6])):
        calls.clear()
        together = rescore(task, 0, hits, views, nlls, 4096, batch=batch).candidates
        assert calls == sizes  # whole views per call, as many as the batch holds
        assert [c.grid for c in together] == [c.grid for c in alone]
        assert [c.hits for c in together] == [c.hits for c in alone]
        assert [c.nll for c in together] == pytest.approx([c.nll for c in alone], rel=1e-5)
    assert len({c.nll for c in alone}) == 3  # the three candidates are told apart


def test_the_deadline_counts_whole_views_only(task):
    views = rescoring_views(task, 4, seed=0)
    hits = {((1,),): 1, ((2,),): 1}
    now = [0.0]

    def nlls(items):  # view i of the call scores i + 1 for every candidate; the clock passes the deadline after it
        now[0] += 1.0
        return [float(n // 2 + 1) for n in range(len(items))]

    rescored = rescore(task, 0, hits, views, nlls, 4096, deadline=1.0, clock=lambda: now[0], batch=4)
    # two views in the first call (1 and 2), the second call never ran: not complete
    assert [c.nll for c in rescored.candidates] == [1.5, 1.5] and not rescored.complete
    assert rescore(task, 0, hits, views, nlls, 4096, batch=4).complete


def test_preloaded_prompts_search_as_prompts_run_one_by_one(model, task):
    """A search batch's prompts prefilled in one call (right-padded): each prompt's slice of the cache gives the
    next-token distribution, every later step and the search's answers of its own prefill."""
    import copy

    import numpy as np
    import torch

    from submission.grid.dfs import search
    from submission.grid.format import encode
    from submission.grid.model import HFStepper
    from submission.grid.rescore import search_views

    peaked = copy.deepcopy(model)
    with torch.no_grad():
        peaked.lm_head.weight.mul_(80.0)  # a trained model's confidence: the search branches and finds answers
    prompts = [encode(shown.train, shown.test_inputs[0], max_len=4096).ids
               for shown in (view.apply(task) for view in search_views(task, 2, 2, seed=0))]
    assert len({len(p) for p in prompts}) == 2  # transposed views differ in length: the batch is padded
    alone, batched = HFStepper(peaked), HFStepper(peaked)
    batched.preload(prompts)
    for prompt in prompts:
        assert np.allclose(batched.prefill(prompt), alone.prefill(prompt), atol=1e-4)
        assert batched.length == alone.length == len(prompt)
        assert np.allclose(batched.push(prompt[1]), alone.push(prompt[1]), atol=1e-4)
    batched.preload(prompts)
    shorter = min(prompts, key=len)  # a padded row; a cut-off of 0.5 keeps the search short (one branch at most)
    one, two = search(HFStepper(peaked), shorter, 0.5), search(batched, shorter, 0.5)
    assert [f.tokens for f in two.found] == [f.tokens for f in one.found] and two.steps == one.steps > 0
    assert [f.logp for f in two.found] == pytest.approx([f.logp for f in one.found], abs=1e-4)
