"""A CUDA out-of-memory error in a task's search or rescoring retries the stage smaller and keeps the finished work
(issue 29): injected on every model call of more than one row, the task gives the answers of a run that never
batched."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from submission.grid.config import load_grid_profile  # noqa: E402
from submission.grid.queue import task_cost  # noqa: E402
from submission.tasks import load_tasks  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_search_and_rescoring_run_out_of_memory_and_give_the_unbatched_answers(arc_data, tmp_path):
    from build.grid_vocab import cut
    from build.tiny import make_checkpoint
    from submission.grid.config import ModelConfig
    from submission.grid.model import load_adapter
    from submission.grid.solve import solve_task

    grid = cut(make_checkpoint(tmp_path / "base", "qwen3", seed=5), tmp_path / "grid")
    task = min(load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks, key=task_cost)
    tiny = load_grid_profile("grid-tiny")
    profile = replace(tiny, ttt=replace(tiny.ttt, rank=4, sequences=2),
                      search=replace(tiny.search, dihedrals=2, colour_perms=1, views_per_batch=2, dfs_batch=2,
                                     preload=True, batch_s=1e6),
                      rescore=replace(tiny.rescore, views=2, batch=8))
    one_by_one = replace(profile, search=replace(profile.search, dfs_batch=1), rescore=replace(profile.rescore,
                                                                                                 batch=1))
    config = ModelConfig(str(grid), "float32")
    torch.manual_seed(0)
    plain = solve_task(load_adapter(config, profile.ttt), task, one_by_one, 2048, 1e6, log=lambda line: None)

    torch.manual_seed(0)
    adapter = load_adapter(config, profile.ttt)
    forward, raised, lines = adapter.model.forward, [], []

    def small_only(*args, **kwargs):
        rows = kwargs["input_ids"].shape[0]
        if rows > 1 and not adapter.model.training:  # the search's and the rescoring's batches
            raised.append(rows)
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 1.00 GiB")
        return forward(*args, **kwargs)

    adapter.model.forward = small_only
    for batched in (profile, replace(profile, search=replace(profile.search, dfs_batch=1))):  # lockstep; preload
        lines.clear()
        hit = solve_task(adapter, task, batched, 2048, 1e6, log=lines.append)
        assert raised and any("out of memory" in line and "one at a time" in line for line in lines), lines
        assert any("rescoring: out of memory" in line for line in lines)
        assert hit.complete == plain.complete and hit.ttt_losses == pytest.approx(plain.ttt_losses, rel=1e-5)
        for ours, theirs in zip(hit.candidates, plain.candidates, strict=True):
            assert [(c.grid, c.hits) for c in ours] == [(c.grid, c.hits) for c in theirs]
            assert [c.nll for c in ours] == pytest.approx([c.nll for c in theirs], rel=1e-4)
