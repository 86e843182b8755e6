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

from submission.grid.profile import GridProfile, RunConfig
from submission.grid.queue import TaskQueue, task_cost
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


def test_a_worker_failing_task_after_task_is_replaced_and_retired_when_its_new_process_fails_too():
    """Issue 45: a sticky CUDA error fails every later task of a process; a new process on the same GPU gets a new
    CUDA context, so the worker is restarted (bounded by respawns) and retired only when its last process fails."""
    queue = TaskQueue({"a": 1, "b": 2, "c": 3, "d": 4, "e": 5}, 10, 20, max_failures=2, respawns=1)
    for task in ("a", "b"):
        assert queue.next(0, 0, 1e9, 1e9, 2)[0] == task
    assert not queue.failed(0, "a") and queue.failed(0, "b")  # the second failure in a row: replaced
    assert 0 not in queue.retired and queue.restarts == {0: 1} and queue.pending[:2] == ["b", "a"]
    assert queue.next(0, 0, 1e9, 1e9, 2)[0] == "c"  # the new process: a task the failing one never had
    queue.done(0, "c")
    assert not queue.failed(0, queue.next(0, 0, 1e9, 1e9, 2)[0])  # the streak started afresh with the process
    assert queue.failed(0, queue.next(0, 0, 1e9, 1e9, 2)[0]) and 0 in queue.retired  # its last process failed too
    assert queue.next(0, 0, 1e9, 1e9, 1) is None and sorted(queue.pending) == ["a", "b", "d", "e"]


def fail_on_a_broken_gpu(worker: int, profile: GridProfile, inbox, report) -> None:
    """Worker 0's GPU is broken for good: every life of it fails every task (the error a sticky CUDA error gives).
    Worker 1 starts only once worker 0 is retired, so which worker gets which task is the test's, not the load's."""
    out = Path(os.environ["GRID_RESPAWN_OUT"])
    (out / f"worker{worker}-{os.getpid()}.json").write_text(json.dumps(profile.run.devices[worker]))
    while worker == 1 and not (out / "retired").exists():
        time.sleep(0.05)
    report.send(("ready", worker, None, None))
    while (message := inbox.get()) is not None:
        task = message[0]
        report.send(("started", worker, task.id, None))
        if worker == 0:
            report.send(("failed", worker, task.id, "RuntimeError: CUDA error: an illegal memory access was "
                                                     "encountered"))
        else:
            report.send(("done", worker, task.id, TaskOutcome(task.id, tuple(() for _ in task.test_inputs), {}, 0,
                                                              0, (), 0, True)))


def test_a_worker_on_a_persistently_failing_gpu_is_replaced_then_retired_and_its_tasks_answered(arc_data, tmp_path,
                                                                                               monkeypatch):
    from submission.grid import workers

    monkeypatch.setenv("GRID_RESPAWN_OUT", str(tmp_path))
    tasks = TaskSet(load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks[:3], ())
    run = RunConfig(devices=("cpu", "cpu"), time_limit_s=60.0, hard_stop_margin_s=1.0, stop_new_margin_s=2.0,
                    min_task_s=1.0, max_task_s=1.0, max_failures=1, respawns=1)
    coordinator = None

    def on_event(kind, worker, task_id, process):
        if kind == "failed" and coordinator.queue.restarts.get(0) == 1:  # its second life failed: retired next
            (tmp_path / "retired").touch()

    coordinator = workers.Coordinator(GridProfile(run=run), tasks, tmp_path / "submission.json",
                                      worker=fail_on_a_broken_gpu, on_event=on_event)
    stats = coordinator.run()
    served = sorted(tasks.tasks, key=lambda t: (task_cost(t), t.id))
    assert [task for task, _ in stats.failed] == [t.id for t in served[:2]]  # one per life of worker 0
    assert stats.respawned == [0] and 0 in coordinator.queue.retired and stats.lost == []
    assert len(list(tmp_path.glob("worker0-*.json"))) == 2  # a new process on its device, which failed too
    assert sorted(stats.done) == sorted(t.id for t in tasks.tasks) and set(stats.by_worker.values()) == {1}


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
        task = message[0]
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
