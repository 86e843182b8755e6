"""Forecast a grid-line run from a grid-line log: the solver's own queue policy on a simulated clock.

    python -m sim.grid --log attempts.jsonl --tasks DIR [--solutions PATH] --profile grid-4b-4xL4
                       [--hidden-tasks 240] [--runs 50] [--seed 0]

Each logged task (attempt-1 records with `grid_line`) gives its seconds by stage, the time limit it had and whether
its attempts were right (when labels are known). A simulated run draws `--hidden-tasks` of them with replacement
and serves them with `submission.grid.queue.TaskQueue` (cheapest first, the same time limits) on `run.devices`
workers; a task lasts the share of its limit it used in the log times the limit it gets now (its stages run until
their share of the limit: an approximation, exact for tasks that used their whole limit), and a task that would end
after the hard stop is unanswered. Model loading and worker start-up are not modelled. Reports the forecast score
(mean and 5-95% over runs), tasks answered by the deadline and the logged seconds by stage.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path

from submission.attempts import AttemptRecord, read_log
from submission.grid.config import GridProfile, load_grid_profile
from submission.grid.queue import TaskQueue, task_cost
from submission.tasks import Task, load_tasks


@dataclass(frozen=True)
class LoggedTask:
    task_id: str
    cost: int
    used: float  # seconds used / time limit
    right: float  # share of its test inputs answered right by either attempt (0 without labels)
    stage_s: dict


def logged_tasks(records: list[AttemptRecord], tasks: dict[str, Task]) -> list[LoggedTask]:
    """One entry per task of the log that is in `tasks`. Pure."""
    by_task: dict[str, list[AttemptRecord]] = {}
    for record in records:
        if record.grid_line and record.task_id in tasks:
            by_task.setdefault(record.task_id, []).append(record)
    out = []
    for task_id, group in sorted(by_task.items()):
        task = tasks[task_id]
        first = next(r for r in group if r.attempt == 1)
        detail = first.grid_line
        right = 0.0
        if task.test_outputs is not None:
            hits = {r.test_index for r in group if r.grid is not None and r.grid == task.test_outputs[r.test_index]}
            right = len(hits) / len(task.test_inputs)
        used = sum(detail["stage_s"].values()) / max(detail["time_limit_s"], 1e-9)
        out.append(LoggedTask(task_id, task_cost(task), min(used, 1.0), right, detail["stage_s"]))
    return out


@dataclass(frozen=True)
class RunForecast:
    score: float  # percent, task-weighted
    answered: int
    tasks: int


def one_run(logged: list[LoggedTask], profile: GridProfile, hidden_tasks: int, rng: random.Random) -> RunForecast:
    run = profile.run
    drawn = {f"t{i}": rng.choice(logged) for i in range(hidden_tasks)}
    queue = TaskQueue({k: v.cost for k, v in drawn.items()}, run.min_task_s, run.max_task_s, run.max_failures)
    workers = len(run.devices)
    free = [(0.0, w) for w in range(workers)]
    answered, score = 0, 0.0
    ends: list[float] = []
    while free:
        free.sort()
        now, worker = free.pop(0)
        ends = [e for e in ends if e > now]
        nxt = queue.next(worker, now, run.stop_new, run.hard_stop, workers, len(ends))
        if nxt is None:
            continue
        task_id, limit = nxt
        end = now + drawn[task_id].used * limit
        if end <= run.hard_stop:
            answered += 1
            score += drawn[task_id].right
            queue.done(worker, task_id)
            ends.append(end)
            free.append((end, worker))
    return RunForecast(100 * score / hidden_tasks, answered, hidden_tasks)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.grid", description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", required=True, type=Path, action="append")
    parser.add_argument("--tasks", required=True, type=Path)
    parser.add_argument("--solutions", type=Path)
    parser.add_argument("--profile", default="grid-4b-4xL4")
    parser.add_argument("--hidden-tasks", type=int, default=240)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    profile = load_grid_profile(args.profile)
    tasks = {t.id: t for t in load_tasks(args.tasks, args.solutions).tasks}
    logged = logged_tasks([r for path in args.log for r in read_log(path)], tasks)
    if not logged:
        print(f"error: {', '.join(map(str, args.log))}: no grid-line records for these tasks", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    runs = [one_run(logged, profile, args.hidden_tasks, rng) for _ in range(args.runs)]
    scores = sorted(r.score for r in runs)
    low, high = scores[int(0.05 * (len(scores) - 1))], scores[int(0.95 * (len(scores) - 1))]
    print(f"{len(logged)} logged tasks, {args.runs} runs of {args.hidden_tasks} tasks on {len(profile.run.devices)} "
          f"workers ({profile.name})")
    print(f"forecast score {statistics.mean(scores):.2f} (5-95%: {low:.2f}-{high:.2f}); answered by the deadline "
          f"{statistics.mean(r.answered for r in runs):.1f} of {args.hidden_tasks}")
    stages = sorted({k for t in logged for k in t.stage_s})
    print("logged seconds by stage (mean per task): " + ", ".join(
        f"{k} {statistics.mean(t.stage_s.get(k, 0.0) for t in logged):.1f}" for k in stages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
