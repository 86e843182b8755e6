"""The grid line's shared task queue: cheapest task first, a time limit per task, retries, failing workers.

Pure policy (STYLE 1): the coordinator passes `now` in and reports what happened; nothing here touches a process
or a clock. A task's cost is its token count under the grid format times its test inputs (what TTT and search
scale with). Each task's time limit is the remaining budget shared among the queued and running tasks and the live
workers, in proportion to what each needs (`needs`: its seconds by size on the line's GPU, run.task_need; without
them, equal shares), clamped to [min_task_s, max_task_s] and never beyond the hard stop. A task whose worker dies
or fails is put back at the front once (`max_tries` = 2), for another worker if one is live. A worker whose process
dies (or is killed, stuck), or fails `max_failures` tasks in a row (a sticky CUDA error fails every later task of
its process), is replaced: its process is started afresh on its device up to `respawns` times (NVARC's workers are
one process per GPU: a lost process would otherwise leave its GPU idle for the rest of the run; a new process gets
a new CUDA context), and retired only when its last allowed process is lost or fails as well.

Every task trains all its steps (NVARC always trains 128) unless the forecast for the whole run says it cannot
afford them (`TrainingPlan`, issue 45): when the work queued and running (each task's `needs`, the left part of the
running ones; without a table, min_task_s each) exceeds what the live workers have left before the hard stop, the
run would leave tasks unanswered, so a task's training gets only its share of its limit; otherwise all its steps,
within its whole limit. A plan at the task's start decides; the log says which and why.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from submission.grid.format import encode
from submission.tasks import Task


def task_cost(task: Task) -> int:
    return len(encode(task.train, task.test_inputs[0], max_len=1 << 30).ids) * len(task.test_inputs)


@dataclass(frozen=True)
class TrainingPlan:
    """How a task's training is budgeted, decided from the whole run when the task starts."""

    full: bool  # all its steps, within the task's whole limit; False: its training share of the limit (ttt.share)
    why: str  # the forecast behind it, for the log


def training_plan(remaining_s: float, queued_s: float, workers: int) -> TrainingPlan:
    """Full training unless the work queued and running (`queued_s`, this task's included) exceeds what `workers`
    have left (`remaining_s` each before the hard stop): then the run would leave tasks unanswered. Pure."""
    left = remaining_s * max(workers, 1)
    full = queued_s <= left
    return TrainingPlan(full, f"forecast: {queued_s:.0f} s of tasks queued and running, {max(workers, 1)} workers x "
                              f"{remaining_s:.0f} s left: " + ("every step" if full else "steps cut to the "
                                                                "training's share of the task's limit"))


def time_limit(remaining_s: float, queued: float, workers: int, lo: float, hi: float) -> float:
    """A fair share of what is left: remaining x workers / queued, within [lo, hi], never past the end. `queued`:
    the work queued and running, in units of this task's need (a count of tasks when all need the same)."""
    share = remaining_s * max(workers, 1) / max(queued, 1)
    return max(0.0, min(max(lo, min(share, hi)), remaining_s))


@dataclass
class TaskQueue:
    costs: dict[str, int]
    min_task_s: float
    max_task_s: float
    max_failures: int = 3
    max_tries: int = 2
    respawns: int = 0  # restarts of a lost worker on its device, per worker
    pending: list[str] = field(default_factory=list)
    tries: dict[str, int] = field(default_factory=dict)
    streak: dict[int, int] = field(default_factory=dict)  # consecutive failures per worker
    retired: set[int] = field(default_factory=set)
    given_up: list[str] = field(default_factory=list)
    last_worker: dict[str, int] = field(default_factory=dict)  # who tried each task last
    restarts: dict[int, int] = field(default_factory=dict)  # per worker, how often it was restarted
    needs: dict[str, float] = field(default_factory=dict)  # a task's expected seconds (run.task_need); absent: alike
    running: dict[int, str] = field(default_factory=dict)  # worker -> the task it was given and has not finished
    started: dict[int, float] = field(default_factory=dict)  # worker -> when its running task started
    plans: dict[str, TrainingPlan] = field(default_factory=dict)  # each task's training plan, at its last start

    def __post_init__(self) -> None:
        self.pending = sorted(self.costs, key=lambda t: (self.costs[t], t))

    def next(self, worker: int, now: float, stop_new: float, hard_stop: float,
             live_workers: int) -> tuple[str, float] | None:
        """The task for an idle worker and its time limit, or None (nothing left, retired, or too late)."""
        if worker in self.retired or not self.pending or now >= stop_new:
            return None
        # a retried task goes to another worker when there is one
        mine = [t for t in self.pending if self.last_worker.get(t) != worker or live_workers <= 1]
        if not mine:
            return None
        task_id = mine[0]
        self.pending.remove(task_id)
        self.last_worker[task_id] = worker
        self.tries[task_id] = self.tries.get(task_id, 0) + 1
        need = self.needs.get(task_id, 1.0)  # the limit shares by need, in any unit
        queued = need + sum(self.needs.get(t, 1.0) for t in (*self.pending, *self.running.values()))
        left = self.need(task_id) + sum(map(self.need, self.pending)) + sum(  # the running tasks' part still to come
            max(self.need(t) - (now - self.started.get(w, now)), 0.0) for w, t in self.running.items())
        self.plans[task_id] = training_plan(hard_stop - now, left, live_workers)
        self.running[worker], self.started[worker] = task_id, now
        limit = time_limit(hard_stop - now, queued / need, live_workers, self.min_task_s, self.max_task_s)
        return task_id, limit

    def need(self, task_id: str) -> float:
        """A task's expected seconds, as the forecast counts them: `needs`, else the least time any task is given
        (min_task_s: without a table of needs, a run that cannot give every task that much is short)."""
        return self.needs.get(task_id, self.min_task_s)

    def done(self, worker: int, task_id: str) -> None:
        self.running.pop(worker, None)
        self.started.pop(worker, None)
        self.streak[worker] = 0

    def failed(self, worker: int, task_id: str) -> bool:
        """A task the worker could not finish, back to the queue once. True: that was its `max_failures`-th failure
        in a row, so its process goes: restarted on its device while `respawns` allow (its streak starts afresh),
        else retired (in `retired`)."""
        self.running.pop(worker, None)
        self.started.pop(worker, None)
        self.streak[worker] = self.streak.get(worker, 0) + 1
        self._retry(task_id)
        if self.streak[worker] < self.max_failures:
            return False
        self._replace(worker)
        return True

    def retire(self, worker: int) -> None:
        """The worker serves no more tasks (it could not start)."""
        self.retired.add(worker)

    def lost(self, worker: int, task_id: str | None) -> bool:
        """The worker's process died: its task goes back to the front of the queue. True: restart the worker on its
        device (`respawns` not yet used up; its failure streak starts afresh); False: it is retired."""
        self.running.pop(worker, None)
        self.started.pop(worker, None)
        if task_id is not None:
            self._retry(task_id)
        return self._replace(worker)

    def _replace(self, worker: int) -> bool:
        """A new process for the worker (True) while its restarts last, else it is retired (False)."""
        if self.restarts.get(worker, 0) < self.respawns:
            self.restarts[worker] = self.restarts.get(worker, 0) + 1
            self.streak[worker] = 0
            return True
        self.retire(worker)
        return False

    def _retry(self, task_id: str) -> None:
        if self.tries.get(task_id, 0) < self.max_tries:
            self.pending.insert(0, task_id)
        else:
            self.given_up.append(task_id)
