"""The grid line's worker processes, without a model: each pinned to its GPU alone, a stuck one killed and started
again on its device with its task back in the queue, restarts bounded (issue 29, section 5).

The workers here are stand-ins (module-level functions, as the spawn start method needs) that answer every task with
no candidates at once; tests/test_grid_workers.py kills real ones, on a tiny model, mid-task.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from submission.grid.config import GridProfile, RunConfig
from submission.grid.queue import TaskQueue
from submission.grid.solve import TaskOutcome
from submission.tasks import TaskSet, load_tasks


def test_each_worker_sees_its_gpu_alone():
    from submission.grid.workers import pin

    assert pin("cuda:2", None) == ("2", "cuda:0")
    assert pin("cuda", None) == ("0", "cuda:0")
    assert pin("cuda:1", "2,3") == ("3", "cuda:0")  # the combined run's grid line, given GPUs 2 and 3
    assert pin("cpu", "2,3") == (None, "cpu")
    with pytest.raises(ValueError, match=r"run.devices: cuda:2 is not among the 2 GPUs of CUDA_VISIBLE_DEVICES=2,3"):
        pin("cuda:2", "2,3")


def test_a_lost_worker_is_restarted_a_bounded_number_of_times():
    queue = TaskQueue({"a": 1, "b": 2, "c": 3}, 10, 20, respawns=2)
    first, _ = queue.next(0, 0, 1e9, 1e9, 2)
    assert queue.lost(0, first) and queue.pending[0] == first  # restarted; its task is next, for another worker
    assert queue.next(0, 0, 1e9, 1e9, 2)[0] != first
    assert queue.lost(0, None) and not queue.lost(0, None)  # the third loss retires it
    assert 0 in queue.retired and queue.next(0, 0, 1e9, 1e9, 1) is None


def answer_at_once(worker: int, profile: GridProfile, inbox, report) -> None:
    """Reports its CUDA_VISIBLE_DEVICES and device, then answers each task with no candidates. Worker 0 hangs on its
    first task in its first life (its files tell its lives apart); worker 1 starts once worker 0 hangs."""
    out = Path(os.environ["GRID_RESPAWN_OUT"])
    life = len(list(out.glob(f"worker{worker}-*.json")))
    (out / f"worker{worker}-{os.getpid()}.json").write_text(json.dumps(
        {"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "device": profile.run.devices[worker]}))
    while worker == 1 and not (out / "stuck").exists():
        time.sleep(0.05)
    report.send(("ready", worker, None, None))
    while (message := inbox.get()) is not None:
        task, _ = message
        report.send(("started", worker, task.id, None))
        if worker == 0 and life == 0:
            (out / "stuck").touch()
            time.sleep(3600)  # stuck: the coordinator kills it
        report.send(("done", worker, task.id, TaskOutcome(task.id, tuple(() for _ in task.test_inputs), {}, 0, 0,
                                                          (), 0, True)))


def test_a_stuck_worker_is_restarted_on_its_gpu_and_its_task_finished(arc_data, tmp_path, monkeypatch):
    from submission.grid import workers

    monkeypatch.setenv("GRID_RESPAWN_OUT", str(tmp_path))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "5,7")
    monkeypatch.setattr(workers, "GRACE_S", 0.5)
    tasks = TaskSet(load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks[:3], ())
    run = RunConfig(devices=("cuda:1", "cuda:0"), time_limit_s=300.0, hard_stop_margin_s=1.0, stop_new_margin_s=2.0,
                    min_task_s=1.0, max_task_s=1.0, respawns=1)
    coordinator = workers.Coordinator(GridProfile(run=run), tasks, tmp_path / "submission.json",
                                      worker=answer_at_once)
    stats = coordinator.run()
    assert [w for w, _ in stats.lost] == [0] and stats.lost[0][1] is not None and stats.respawned == [0]
    assert sorted(stats.done) == sorted(t.id for t in tasks.tasks)  # the stuck task too, by either worker
    lives: dict[str, list] = {"worker0": [], "worker1": []}
    for path in tmp_path.glob("worker*.json"):
        lives[path.name.split("-")[0]].append(json.loads(path.read_text()))
    assert lives["worker0"] == [{"visible": "7", "device": "cuda:0"}] * 2  # both lives on its own GPU alone
    assert lives["worker1"] == [{"visible": "5", "device": "cuda:0"}]
