"""Workers on a shared queue: one process per device, one coordinator that owns the queue, the log and the answers.

Each worker loads the grid model once, wraps it with the task adapter once, and then solves the tasks it is sent
(`solve.solve_task`), reporting `started` / `done` / `failed` on its own report pipe. One pipe per worker, not one
shared queue: a worker killed in the middle of a report (SIGKILL, the OOM killer) leaves a shared queue's write lock
held for ever and every other worker's reports stuck behind it; a private pipe only loses its own, half-written,
message, which reads as end of file. The coordinator is the only writer: it appends each task's records to the
attempt log and rewrites the answer file atomically after every task. It watches the workers: a process that dies
(killed, out of memory) or overruns its task's limit by more than `GRACE_S` is killed and its task goes back to the
front of the queue for another worker (once); a worker that fails `run.max_failures` tasks in a row (a sticky CUDA
error fails every later task of its process) is killed too, its failed tasks already back in the queue. Either way
the process is started afresh on its device (a new CUDA context) up to `run.respawns` times, then that worker is
retired (queue.TaskQueue decides).
A worker whose coordinator is gone exits when idle. No task starts after `run.stop_new`; at the hard stop (or on
`stop`: SIGTERM) every worker is terminated and the answers so far stand.

As NVARC runs them, each worker process sees one GPU: `CUDA_VISIBLE_DEVICES` names its device alone (within what the
run itself was given: the combined run's grid line sees two GPUs) and the worker loads onto `cuda:0`, so no worker
makes a CUDA context or a stray allocation on another worker's GPU.

`resume`: a run restarted with the log of a killed one restores every task whose records (attempts 1 and 2 of every
test input) are all in the log, answers included, and queues only the others. A task killed while its records were
being written is redone; its earlier, partial records stay in the log (readers take a task's last records).
"""

from __future__ import annotations

import multiprocessing as mp
import os
import pickle
import queue as queue_module
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from multiprocessing.connection import Connection, wait
from pathlib import Path

from submission.answer_file import AnswerFile
from submission.attempts import AttemptLog, AttemptRecord, GridDetail, read_log, repair_log
from submission.grid.profile import GridProfile
from submission.grid.queue import TaskQueue, task_cost
from submission.grid.rescore import choose
from submission.grid.solve import TaskOutcome
from submission.grids import EMPTY_ANSWER
from submission.schedule import Level
from submission.tasks import Task, TaskSet

GRACE_S = 30.0  # a task may overrun its limit by one model step; a worker this far past it is stuck


def pin(device: str, visible: str | None) -> tuple[str | None, str]:
    """A worker's `CUDA_VISIBLE_DEVICES` and the device it loads onto, from its profile device and the run's own
    `CUDA_VISIBLE_DEVICES` (None: every GPU). `cuda:N` is the run's N-th visible GPU; a CPU worker is left alone."""
    if not device.startswith("cuda"):
        return None, device
    index = int(device.partition(":")[2] or 0)
    if not visible:
        return str(index), "cuda:0"
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if index >= len(ids):
        raise ValueError(f"run.devices: {device} is not among the {len(ids)} GPUs of CUDA_VISIBLE_DEVICES={visible}")
    return ids[index], "cuda:0"


def pinned(target: Callable, visible: str | None, worker: int, profile: GridProfile, inbox, report) -> None:
    """The worker process's entry: its GPU alone made visible before anything touches CUDA, then `target` with a
    profile whose device for this worker is the one it now sees (cuda:0)."""
    if visible is not None:
        os.environ["CUDA_VISIBLE_DEVICES"] = visible
        devices = profile.run.devices[:worker] + ("cuda:0",) + profile.run.devices[worker + 1:]
        profile = replace(profile, run=replace(profile.run, devices=devices))
    target(worker, profile, inbox, report)


def worker_main(worker: int, profile: GridProfile, inbox, report: Connection) -> None:
    """A worker process: load once, then solve tasks from `inbox` until told to stop (None) or orphaned. A task
    comes as (task, time limit, queue.TrainingPlan)."""
    import torch

    from submission.grid.format import read_format
    from submission.grid.model import load_adapter
    from submission.grid.solve import solve_task

    def send(kind: str, task_id: str | None, payload) -> None:
        try:
            report.send((kind, worker, task_id, payload))
        except OSError:  # the coordinator is gone: nobody is left to report to
            os._exit(0)

    if profile.run.threads:
        torch.set_num_threads(profile.run.threads)
    parent = os.getppid()
    device = profile.run.devices[worker]
    try:
        fmt = read_format(profile.model.path, profile.model.format)  # before the weights: a bad tokenizer costs nothing
        adapter = load_adapter(profile.model, profile.ttt, device)
    except Exception as err:  # noqa: BLE001 - reported, then the worker is gone
        send("dead", None, f"{type(err).__name__}: {err}")
        return
    send("ready", None, None)
    while True:
        try:
            message = inbox.get(timeout=1.0)
        except queue_module.Empty:
            if os.getppid() != parent:
                return
            continue
        if message is None:
            return
        task, limit, plan = message
        send("started", task.id, None)
        # the task's training share by its size (run.ttt_s), handed to solve_task as its ttt.share
        shaped = replace(profile, ttt=replace(profile.ttt, share=profile.run.ttt_share(task_cost(task),
                                                                                        profile.ttt.share)))
        try:
            send("done", task.id, solve_task(adapter, task, shaped, profile.run.context(worker), limit, fmt=fmt,
                                             plan=plan))
        except Exception as err:  # noqa: BLE001 - one task's failure is reported, the worker goes on
            send("failed", task.id, f"{type(err).__name__}: {err}")


def receive(reports: dict[Connection, int], timeout: float) -> list[tuple]:
    """The reports that arrive within `timeout`, from any worker. A pipe whose worker died (at its end, or in the
    middle of a message) is closed and dropped; the process watch gives that worker's task back."""
    out = []
    for conn in wait(list(reports), timeout):
        try:
            out.append(conn.recv())
        except (EOFError, OSError, pickle.UnpicklingError):
            del reports[conn]
            conn.close()
    return out


def records(outcome: TaskOutcome, worker: int, limit: float, started_s: float, finished_s: float,
            seed: int) -> list[AttemptRecord]:
    """The log lines of one finished task: per test input, attempts 1 and 2; attempt 1 carries every candidate
    with its hits, NLL and score, the seconds by stage and the training's report (its sequences, the steps planned
    and run and why fewer, the checkpointing decision, out-of-memory retries, skipped steps, first and last loss) and
    the search's steps."""
    out = []
    for index, candidates in enumerate(outcome.candidates):
        first, second = choose(candidates)
        detail = GridDetail(worker, limit, outcome.stage_s, outcome.ttt_steps, outcome.ttt_planned,
                            outcome.ttt_checkpointing, outcome.ttt_oom_retries, outcome.ttt_skipped,
                            (outcome.ttt_losses[0], outcome.ttt_losses[-1]) if outcome.ttt_losses else (),
                            outcome.search_steps, outcome.complete, tuple(c.to_json() for c in candidates),
                            ttt_sequences=outcome.ttt_sequences, ttt_why=outcome.ttt_why)
        for attempt, grid in ((1, first), (2, second)):
            out.append(AttemptRecord(outcome.task_id, index, attempt, Level(attempt - 1), seed, 0,
                                     grid=grid if candidates else None,
                                     parse_error=None if candidates else "the search found no answer",
                                     started_s=started_s, finished_s=finished_s, finish="grid",
                                     grid_line=detail if attempt == 1 else GridDetail(worker)))
    return out


@dataclass
class RunStats:
    done: list[str] = field(default_factory=list)
    failed: list[tuple[str, str]] = field(default_factory=list)
    lost: list[tuple[int, str | None]] = field(default_factory=list)  # (worker, its task) of dead workers
    by_worker: dict[str, int] = field(default_factory=dict)  # task id -> the worker that finished it
    restored: list[str] = field(default_factory=list)  # tasks finished by an earlier run of the same log
    respawned: list[int] = field(default_factory=list)  # workers restarted on their device, once per restart


class Coordinator:
    """Runs the queue to the end or the hard stop. `on_event(kind, worker, task_id, process)` is called for every
    worker message (tests use it to kill a worker mid-task)."""

    def __init__(self, profile: GridProfile, tasks: TaskSet, out: str | Path, log: str | Path | None = None,
                 clock: Callable[[], float] | None = None, on_event: Callable | None = None,
                 worker: Callable = worker_main, resume: bool = False):
        self.profile, self.tasks, self.on_event, self.worker = profile, tasks, on_event, worker
        self.by_id: dict[str, Task] = {t.id: t for t in tasks.tasks}
        self.answers = AnswerFile(out, tasks.test_counts())
        self.stats = RunStats()
        self.stopping = ""  # why the run ends early ("SIGTERM"): no new task, the running ones ended (stop)
        if resume and log and Path(log).exists():
            self.restore(Path(log))
        self.log = AttemptLog(log) if log else None
        start = time.monotonic()
        self.clock = clock or (lambda: time.monotonic() - start)
        run = profile.run
        restored = set(self.stats.restored)
        costs = {t.id: task_cost(t) for t in tasks.tasks if t.id not in restored}
        self.queue = TaskQueue(costs, run.min_task_s, run.max_task_s, run.max_failures, respawns=run.respawns,
                               needs={t: run.task_need(c) for t, c in costs.items()} if run.task_s else {})

    def stop(self, reason: str) -> None:
        """End the run early, as at the hard stop (a signal handler calls it): the loop sees it within 0.2 s."""
        print(f"{reason}: no new tasks; ending the running ones with the answers so far", file=sys.stderr, flush=True)
        self.stopping = reason

    def restore(self, log: Path) -> None:
        """The tasks an earlier run of this log finished: their answers into the answer file, their ids into
        `stats.restored` (the queue leaves them out). A torn last line is cut first (appending after it would
        swallow the next record)."""
        repaired = repair_log(log)
        if repaired:
            print(f"attempt log: {repaired}", file=sys.stderr)
        got: dict[str, dict[tuple[int, int], AttemptRecord]] = {}
        for record in read_log(log):
            if record.task_id in self.by_id:
                got.setdefault(record.task_id, {})[(record.test_index, record.attempt)] = record
        for task_id, slots in sorted(got.items()):
            inputs = range(len(self.by_id[task_id].test_inputs))
            if all((i, a) in slots for i in inputs for a in (1, 2)):
                for i in inputs:
                    first, second = slots[(i, 1)].grid, slots[(i, 2)].grid
                    self.answers.set(task_id, i, (first or EMPTY_ANSWER, second or EMPTY_ANSWER))
                self.stats.restored.append(task_id)
        self.answers.write()

    def spawn(self, w: int, context, inboxes: list, processes: list, reports: dict) -> None:
        """Start worker `w`'s process (again, after a loss: a fresh inbox, since a process killed inside the old
        one's reader may have left it locked), pinned to its device."""
        visible, _ = pin(self.profile.run.devices[w], os.environ.get("CUDA_VISIBLE_DEVICES"))
        inboxes[w] = context.Queue()
        reader, sender = context.Pipe(duplex=False)
        processes[w] = context.Process(target=pinned, args=(self.worker, visible, w, self.profile, inboxes[w], sender),
                                       daemon=True)
        processes[w].start()
        sender.close()  # the worker holds the only write end: its death reads as end of file here
        reports[reader] = w

    def replace(self, w: int, processes: list, reports: dict, ready: set, gone: set, spawn: Callable[[], None]) -> None:
        """Worker `w`'s process ends (killed if still alive) and its pipe is dropped; `spawn` starts a new one on its
        device unless the queue retired the worker."""
        if processes[w].is_alive():
            processes[w].kill()
        processes[w].join()
        ready.discard(w)
        for reader in [r for r, owner in reports.items() if owner == w]:
            del reports[reader]
            reader.close()
        if w in self.queue.retired:
            gone.add(w)
        else:
            self.stats.respawned.append(w)
            spawn()

    def run(self) -> RunStats:
        run = self.profile.run
        if not self.queue.pending:  # everything restored: no worker needs to load the model
            if self.log is not None:
                self.log.close()
            return self.stats
        for device in run.devices:  # a device outside CUDA_VISIBLE_DEVICES is refused before any process starts
            pin(device, os.environ.get("CUDA_VISIBLE_DEVICES"))
        context = mp.get_context("spawn")
        count = len(run.devices)
        inboxes: list = [None] * count
        processes: list = [None] * count
        reports: dict[Connection, int] = {}
        for w in range(count):
            self.spawn(w, context, inboxes, processes, reports)
        ready: set[int] = set()
        busy: dict[int, tuple[str, float, float]] = {}  # worker -> (task id, started, limit)
        gone: set[int] = set()
        try:
            while self.clock() < run.hard_stop and not self.stopping:
                live = [w for w in range(count) if w not in gone and w not in self.queue.retired]
                for w in sorted(ready - set(busy) - gone):
                    nxt = self.queue.next(w, self.clock(), run.stop_new, run.hard_stop, len(live))
                    if nxt is not None:
                        busy[w] = (nxt[0], self.clock(), nxt[1])
                        inboxes[w].put((self.by_id[nxt[0]], nxt[1], self.queue.plans[nxt[0]]))
                if not busy and (not self.queue.pending or not live or self.clock() >= run.stop_new):
                    break
                for kind, w, task_id, payload in receive(reports, timeout=0.2):
                    if w in gone:  # retired for good: what it still says changes nothing
                        continue
                    if self._event(kind, w, task_id, payload, busy, ready, gone, processes[w]):
                        # failing task after task: its process goes, a new one on its device if restarts are left
                        print(f"worker {w} failed {run.max_failures} tasks in a row: "
                              f"{'restarting it' if w not in self.queue.retired else 'retired'}", file=sys.stderr)
                        self.replace(w, processes, reports, ready, gone, lambda: self.spawn(
                            w, context, inboxes, processes, reports))
                open_pipes = set(reports.values())
                for w, process in enumerate(processes):  # dead or stuck workers give their task back
                    if w in gone:
                        continue
                    stuck = w in busy and self.clock() > busy[w][1] + busy[w][2] + GRACE_S
                    dead = not process.is_alive() and w not in open_pipes  # its last reports are read first
                    if dead or stuck:
                        task = busy.pop(w, (None,))[0]
                        self.stats.lost.append((w, task))
                        again = self.queue.lost(w, task)
                        print(f"worker {w} {'stuck' if stuck else 'died'}"
                              f"{f' on task {task}: it goes back to the queue' if task else ''}"
                              f"{f'; restarting it on {run.devices[w]}' if again else ''}", file=sys.stderr)
                        self.replace(w, processes, reports, ready, gone, lambda: self.spawn(
                            w, context, inboxes, processes, reports))
        finally:  # idle workers are told to stop; busy ones are past the hard stop or the queue's end: killed
            for w, inbox in enumerate(inboxes):
                if w in busy:
                    processes[w].kill()
                elif processes[w].is_alive():
                    inbox.put(None)
            for process in processes:
                process.join(timeout=5)
                if process.is_alive():
                    process.kill()
                    process.join()
            for reader in reports:
                reader.close()
            if self.log is not None:
                self.log.close()
        return self.stats

    def _event(self, kind: str, w: int, task_id: str | None, payload, busy: dict, ready: set, gone: set,
               process) -> bool:
        """Act on one worker message; True when the worker's process must be replaced (`TaskQueue.failed`)."""
        if self.on_event is not None:
            self.on_event(kind, w, task_id, process)
        if kind == "ready":
            ready.add(w)
        elif kind == "dead":
            print(f"worker {w} could not start: {payload}", file=sys.stderr)
            gone.add(w)  # loading fails the same way again: not restarted
            self.queue.retire(w)
        elif kind == "failed":
            busy.pop(w, None)
            self.stats.failed.append((task_id, payload))
            print(f"task {task_id} failed on worker {w}: {payload}", file=sys.stderr)
            return self.queue.failed(w, task_id)
        elif kind == "done":
            _, started, limit = busy.pop(w)
            self.queue.done(w, task_id)
            self.stats.done.append(task_id)
            self.stats.by_worker[task_id] = w
            for record in records(payload, w, limit, started, self.clock(), self.profile.rescore.seed):
                if self.log is not None:
                    self.log.append(record)
                if record.attempt == 1:
                    first = record
                else:
                    self.answers.update(task_id, record.test_index,
                                        (first.grid or EMPTY_ANSWER, record.grid or EMPTY_ANSWER))
            print(f"task {task_id}: worker {w}, {self.clock() - started:.1f} s of {limit:.0f} "
                  f"({len(self.stats.done)}/{len(self.by_id)} done)", file=sys.stderr)
        return False
