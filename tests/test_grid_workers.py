"""The grid line's workers as real processes: two CPU workers on a tiny grid model, one killed mid-task (twice: it is
restarted on its device and killed again).

The killed worker's task must be finished by the other worker, every task must be answered in the log, and the
answer file must be complete, valid JSON throughout (it is rewritten atomically after every task). A worker that
dies in the middle of a report must not hold up the other worker's reports; one whose device fails every task is
replaced by a new process on it.

No test here may depend on which process gets there first (issue 45: on a loaded machine worker 1 took every task
before worker 0's second life started one): worker 1 (`held_back`) starts only when the test has seen worker 0 do
what it checks, so the test decides which worker gets which task.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from submission.attempts import read_log  # noqa: E402
from submission.grid.queue import task_cost  # noqa: E402
from submission.profiles import load_grid_profile  # noqa: E402
from submission.tasks import TaskSet, load_tasks  # noqa: E402


@pytest.fixture(scope="module")
def grid_model(tmp_path_factory):
    from build.models.grid_vocab import cut
    from build.models.tiny import make_checkpoint

    root = tmp_path_factory.mktemp("grid-workers")
    return cut(make_checkpoint(root / "base", "qwen3", seed=4), root / "grid")


def cheapest(arc_data, count: int) -> TaskSet:
    every = load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks
    return TaskSet(tuple(sorted(every, key=lambda t: (task_cost(t), t.id))[:count]), ())  # the queue's order


def small_profile(grid_model):
    profile = load_grid_profile("grid-tiny")
    profile = replace(profile, model=replace(profile.model, path=str(grid_model)),
                      ttt=replace(profile.ttt, sequences=2),
                      search=replace(profile.search, dihedrals=1, colour_perms=2, batch_s=2.0),
                      rescore=replace(profile.rescore, views=1),
                      run=replace(profile.run, time_limit_s=400.0, min_task_s=4.0, max_task_s=8.0))
    return profile


def held_back(worker, profile, inbox, report):
    """worker_main, except that worker 1 loads only once the file $GRID_GO exists (the test's on_event makes it)."""
    from submission.grid.workers import worker_main

    while worker == 1 and not Path(os.environ["GRID_GO"]).exists():
        time.sleep(0.05)
    worker_main(worker, profile, inbox, report)


def test_a_killed_worker_loses_nothing(grid_model, arc_data, tmp_path, monkeypatch):
    from submission.grid.workers import Coordinator

    tasks, profile = cheapest(arc_data, 4), small_profile(grid_model)
    out = tmp_path / "submission.json"
    monkeypatch.setenv("GRID_GO", str(tmp_path / "go"))
    killed: list[str] = []
    snapshots: list[dict] = []

    def on_event(kind, worker, task_id, process):
        snapshots.append(json.loads(out.read_text()))  # valid JSON whenever the coordinator looks
        if kind == "started" and worker == 0 and not killed:
            killed.append(task_id)
            os.kill(process.pid, signal.SIGKILL)  # mid-task: it has just started its test-time training
            (tmp_path / "go").touch()  # worker 1 starts now

    coordinator = Coordinator(profile, tasks, out, tmp_path / "attempts.jsonl", on_event=on_event, worker=held_back)
    stats = coordinator.run()
    assert stats.lost == [(0, killed[0])]
    assert sorted(stats.done) == sorted(t.id for t in tasks.tasks)
    assert stats.by_worker[killed[0]] == 1  # the other worker took it
    answer = json.loads(out.read_text())
    assert sorted(answer) == sorted(t.id for t in tasks.tasks)
    for task in tasks.tasks:
        assert len(answer[task.id]) == len(task.test_inputs)
    records = read_log(tmp_path / "attempts.jsonl")
    assert len(records) == 2 * sum(len(t.test_inputs) for t in tasks.tasks)
    firsts = [r for r in records if r.attempt == 1]
    assert all(r.grid_line.candidates is not None and r.grid_line.stage_s is not None for r in firsts)
    assert all(r.grid is not None or r.parse_error for r in records)
    assert len(snapshots) >= 2 * len(tasks.tasks)


def test_a_worker_killed_twice_is_restarted_and_its_tasks_finished(grid_model, arc_data, tmp_path, monkeypatch):
    """Worker 1 starts after worker 0's second kill: until then worker 0's lives are the only ones taking tasks, so
    its second life gets one (each killed task goes back for the other worker, the next cheapest to worker 0)."""
    from submission.grid.workers import Coordinator

    tasks, profile = cheapest(arc_data, 4), small_profile(grid_model)
    # budgets by size, as grid-4b-4xL4 has them: each task's training share from run.ttt_s / run.task_s
    profile = replace(profile, run=replace(profile.run, size_tokens=(100, 4000), task_s=(4.0, 8.0), ttt_s=(1.0, 4.0)))
    monkeypatch.setenv("GRID_GO", str(tmp_path / "go"))
    killed: list[str] = []

    def on_event(kind, worker, task_id, process):
        if kind == "started" and worker == 0 and len(killed) < 2:
            killed.append(task_id)
            os.kill(process.pid, signal.SIGKILL)  # mid-task, in its first life and again in its second
            if len(killed) == 2:
                (tmp_path / "go").touch()

    stats = Coordinator(profile, tasks, tmp_path / "submission.json", tmp_path / "attempts.jsonl",
                        on_event=on_event, worker=held_back).run()
    assert profile.run.respawns == 2 and killed == [t.id for t in tasks.tasks[:2]]  # the two cheapest, in order
    assert stats.lost == [(0, killed[0]), (0, killed[1])] and stats.respawned == [0, 0]
    assert stats.by_worker[killed[0]] == stats.by_worker[killed[1]] == 1
    assert sorted(stats.done) == sorted(t.id for t in tasks.tasks)  # both killed tasks finished
    answer = json.loads((tmp_path / "submission.json").read_text())
    assert sorted(answer) == sorted(t.id for t in tasks.tasks)


def report_where_it_loads(worker, profile, inbox, report):
    """A stand-in worker: loads the model as worker_main does, writes what it sees (its CUDA_VISIBLE_DEVICES, the
    GPUs torch counts, the model's device) and exits as a worker that could not start, which ends the run."""
    import torch

    from submission.grid.model import load_model

    model = load_model(profile.model.path, profile.model.dtype, profile.run.devices[worker])
    seen = {"visible": os.environ.get("CUDA_VISIBLE_DEVICES"), "gpus": torch.cuda.device_count(),
            "device": str(next(model.parameters()).device)}
    (Path(os.environ["GRID_WORKER_OUT"]) / f"worker{worker}.json").write_text(json.dumps(seen))
    report.send(("dead", worker, None, "a stand-in: it only loads"))


@pytest.mark.requires_gpu
def test_each_worker_loads_onto_its_own_gpu_alone(grid_model, arc_data, tmp_path, monkeypatch):
    """One process per GPU, as NVARC runs them: a worker on the last GPU sees that GPU alone (as its cuda:0), so it
    can make no context or allocation on GPU 0 (.ci/gpu-checks)."""
    import torch

    from submission.grid.workers import Coordinator

    last = torch.cuda.device_count() - 1
    monkeypatch.setenv("GRID_WORKER_OUT", str(tmp_path))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    profile = small_profile(grid_model)
    profile = replace(profile, run=replace(profile.run, devices=(f"cuda:{last}",)))
    Coordinator(profile, cheapest(arc_data, 1), tmp_path / "submission.json", worker=report_where_it_loads).run()
    seen = json.loads((tmp_path / "worker0.json").read_text())
    assert seen == {"visible": str(last), "gpus": 1, "device": "cuda:0"}


class DiesMidReport:
    """Worker 0's report pipe, as a process killed inside `send` leaves it: the start of a message, never finished.
    Before it dies it lets worker 1 start ($GRID_GO)."""

    def __init__(self, pipe):
        self.pipe = pipe

    def send(self, message) -> None:
        if message[0] == "started":
            Path(os.environ["GRID_GO"]).touch()
            os.write(self.pipe.fileno(), struct.pack("!i", 1 << 16) + b"\x80\x05 half a report")
            os._exit(9)
        self.pipe.send(message)


def worker_dying_mid_report(worker, profile, inbox, report):
    """Worker 0 dies in its first life's first report of a task; worker 1 starts once it has."""
    from submission.grid.workers import worker_main

    first_life = worker == 0 and not Path(os.environ["GRID_GO"]).exists()
    while worker == 1 and not Path(os.environ["GRID_GO"]).exists():
        time.sleep(0.05)
    worker_main(worker, profile, inbox, DiesMidReport(report) if first_life else report)


def test_a_worker_dying_mid_report_holds_up_no_other(grid_model, arc_data, tmp_path, monkeypatch):
    from submission.grid.workers import Coordinator

    monkeypatch.setenv("GRID_GO", str(tmp_path / "go"))
    tasks, profile = cheapest(arc_data, 2), small_profile(grid_model)
    coordinator = Coordinator(profile, tasks, tmp_path / "submission.json", worker=worker_dying_mid_report)
    stats = coordinator.run()
    assert stats.lost == [(0, tasks.tasks[0].id)]
    assert sorted(stats.done) == sorted(t.id for t in tasks.tasks)
    assert stats.by_worker[tasks.tasks[0].id] == 1  # its reports came through while worker 0's pipe was torn


def sticky_cuda_error(worker, profile, inbox, report):
    """Worker 0's device fails persistently in its first process: every task raises the error a sticky CUDA error
    gives (the process's context is lost; a new process gets a new one). Worker 1 starts once worker 0's second
    process has finished a task ($GRID_GO)."""
    import submission.grid.solve as solve
    from submission.grid.workers import worker_main

    if worker == 0 and not Path(os.environ["GRID_FAULTY"]).exists():
        Path(os.environ["GRID_FAULTY"]).touch()

        def fails(*args, **kwargs):
            raise RuntimeError("CUDA error: an illegal memory access was encountered")
        solve.solve_task = fails  # worker_main looks it up when it starts
    while worker == 1 and not Path(os.environ["GRID_GO"]).exists():
        time.sleep(0.05)
    worker_main(worker, profile, inbox, report)


def test_a_worker_whose_device_fails_every_task_is_replaced_and_its_tasks_answered(grid_model, arc_data, tmp_path,
                                                                                 monkeypatch):
    """Issue 45: a worker that fails run.max_failures tasks in a row gets a new process on its device instead of
    leaving the GPU idle; its failed tasks go to the other worker, and the new process solves a task of its own."""
    from submission.grid.workers import Coordinator

    monkeypatch.setenv("GRID_GO", str(tmp_path / "go"))
    monkeypatch.setenv("GRID_FAULTY", str(tmp_path / "faulty"))
    tasks, profile = cheapest(arc_data, 4), small_profile(grid_model)

    def on_event(kind, worker, task_id, process):
        if kind == "done" and worker == 0:
            (tmp_path / "go").touch()

    coordinator = Coordinator(profile, tasks, tmp_path / "submission.json", tmp_path / "attempts.jsonl",
                              on_event=on_event, worker=sticky_cuda_error)
    stats = coordinator.run()
    assert profile.run.max_failures == 3 and profile.run.respawns >= 1
    failed = [t.id for t in tasks.tasks[:3]]
    assert [task for task, _ in stats.failed] == failed and "CUDA error" in stats.failed[0][1]
    assert stats.respawned == [0] and stats.lost == [] and 0 not in coordinator.queue.retired
    assert stats.by_worker[tasks.tasks[3].id] == 0  # the new process on the same device solved one
    assert all(stats.by_worker[task] == 1 for task in failed)  # its failed tasks, each retried once elsewhere
    answer = json.loads((tmp_path / "submission.json").read_text())
    assert sorted(answer) == sorted(t.id for t in tasks.tasks)


def test_a_grid_run_in_process_leaves_no_watchdog_behind(grid_model, arc_data, tmp_path):
    """training.corpus probe runs the solver in its own process (`submission.lines.run_profile(args, watchdog=False)`),
    once per panel: a grid profile must not arm a watchdog there, or `os._exit` (or SIGALRM) ends the caller after the
    run returns (issue 30). The run here takes a 3 s deadline; the caller then lives past it and says so."""
    kwargs = dict(profile="grid-tiny", model=str(grid_model), deadline=3, scale_schedule=True, max_tasks=1)
    script = ("import sys, time\nfrom pathlib import Path\nfrom submission.lines import arguments, run_profile\n"
              f"args = arguments(Path({str(arc_data / 'arc-agi-2' / 'evaluation')!r}), "
              f"Path({str(tmp_path / 'submission.json')!r}), **{kwargs!r})\n"
              "status = run_profile(args, watchdog=False)\nprint('returned', status, flush=True)\ntime.sleep(5)\n"
              "print('still alive', flush=True)\n")
    done = subprocess.run([sys.executable, "-c", script], cwd=Path(__file__).resolve().parents[1], capture_output=True,
                          text=True, timeout=120)
    assert "still alive" in done.stdout, (done.returncode, done.stdout, done.stderr[-2000:])
