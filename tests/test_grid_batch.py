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
    from build.grid_vocab import cut
    from build.tiny import make_checkpoint
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

    alone = rescore(task, 0, hits, views, lambda items: [answer_nlls(model, [i])[0] for i in items], 4096)
    for batch, sizes in ((12, [12]), (8, [6, 6])):
        calls.clear()
        together = rescore(task, 0, hits, views, nlls, 4096, batch=batch)
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

    ranked = rescore(task, 0, hits, views, nlls, 4096, deadline=1.0, clock=lambda: now[0], batch=4)
    assert [c.nll for c in ranked] == [1.5, 1.5]  # two views in the first call (1 and 2), the second call never ran
