"""A CUDA out-of-memory error in a task's search or rescoring retries the stage smaller and keeps the finished work
(issue 29): injected on every model call of more than one row, the task gives the answers of a run that never
batched."""

from __future__ import annotations

from dataclasses import replace

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("peft")

from submission.grid.queue import task_cost  # noqa: E402
from submission.profiles import load_grid_profile  # noqa: E402
from submission.tasks import load_tasks  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_search_and_rescoring_run_out_of_memory_and_give_the_unbatched_answers(arc_data, tmp_path):
    from build.models.grid_vocab import cut
    from build.models.tiny import make_checkpoint
    from submission.grid.profile import ModelConfig
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


def test_the_trainings_report_reaches_the_attempt_log_and_its_lines_name_the_task(arc_data, tmp_path):
    """An out-of-memory error in a training step (issue 29): the checkpointing decision, the retry, the skipped and
    the planned and run steps are in the attempt log's grid detail (submission.grid.workers.records), and every
    training line the worker prints names its task."""
    from build.models.grid_vocab import cut
    from build.models.tiny import make_checkpoint
    from submission.attempts import AttemptLog, read_log
    from submission.grid.profile import ModelConfig
    from submission.grid.model import load_adapter
    from submission.grid.solve import solve_task
    from submission.grid.workers import records

    grid = cut(make_checkpoint(tmp_path / "base", "qwen3", seed=5), tmp_path / "grid")
    task = min(load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks, key=task_cost)
    tiny = load_grid_profile("grid-tiny")
    profile = replace(tiny, ttt=replace(tiny.ttt, rank=4, sequences=3),
                      search=replace(tiny.search, dihedrals=1, colour_perms=1, views_per_batch=1, dfs_batch=1,
                                     max_side=4), rescore=replace(tiny.rescore, views=1))
    adapter = load_adapter(ModelConfig(str(grid), "float32"), profile.ttt)
    forward, calls = adapter.model.forward, [0]

    def second_step_fails(*args, **kwargs):
        if adapter.model.training:
            calls[0] += 1
            if calls[0] == 2:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return forward(*args, **kwargs)

    adapter.model.forward = second_step_fails
    lines: list[str] = []
    outcome = solve_task(adapter, task, profile, 2048, 1e6, log=lines.append)
    log = AttemptLog(tmp_path / "attempts.jsonl")
    for record in records(outcome, 0, 1e6, 0.0, 1.0, 0):
        log.append(record)
    log.close()
    detail = next(r for r in read_log(tmp_path / "attempts.jsonl") if r.attempt == 1).grid_line
    assert (detail.ttt_planned, detail.ttt_steps, detail.ttt_skipped) == (3, 3, 0)
    assert detail.ttt_checkpointing is True and detail.ttt_oom_retries == 1
    training = [line for line in lines if "ttt:" in line]
    assert any("checkpointing off" in line for line in training) and any("retried" in line for line in training)
    assert all(line.startswith(f"task {task.id}: ttt: ") for line in training), training
