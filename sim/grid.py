"""Forecast a grid-line run from a grid-line log: the solver's own queue policy on a simulated clock.

    python -m sim.grid --log attempts.jsonl --tasks DIR [--solutions PATH] --profile grid-4b-4xL4
                       [--hidden-tasks 240] [--runs 50] [--seed 0]
                       [--reasoning-log REASONING.jsonl --both both-4xL4 [--serving FILE]]

Each logged task (attempt-1 records with `grid_line`) gives its seconds by stage, the time limit it had and whether
its attempts were right (when labels are known). A simulated run draws `--hidden-tasks` of them with replacement and
serves them with `submission.grid.queue.TaskQueue` (cheapest first, the same time limits) on `run.devices` workers;
a task lasts the share of its limit it used in the log times the limit it gets now (its stages run until their share
of the limit: an approximation, exact for tasks that used their whole limit), its limit weighted by its size as in
the run (run.task_s), and a task that would end after the hard stop is unanswered. The queue's training plan is
counted as the run makes it: how many tasks the forecast gives only their training share (fewer steps). Model
loading, worker start-up and restarts are not modelled. Reports the forecast score (mean and 5-95% over runs), tasks
answered by the deadline and the logged seconds by stage.

With `--reasoning-log` and a combined profile (`--both`, line = "both"), three forecasts on the same drawn tasks
(common random numbers): all GPUs to the grid line (`--profile`), all GPUs to the reasoning line (the combined
profile's reasoning profile, the solver's scheduler on the serving model `--serving`, default
sim/serving_models/PROFILE.toml: sim.run), and the split (each line as the combined run starts it,
submission.profiles.line_configs with every override of the combined profile: `split_lines`; the reasoning line on
the serving model scaled to its share of the GPUs, answers merged by submission.merge). Tasks are drawn from those
both logs hold with labels, so each draw keeps how the two lines did on the same task. Approximate: the reasoning
line's throughput and KV cache are taken as proportional to its GPUs (a TP2 engine on two L4s has less than half the
KV cache of TP4 on four: its weights take twice the share per GPU, so the split is forecast optimistically for the
reasoning line); the grid line's tasks last as in its log.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from sim.pool import AttemptPool
from sim.run import simulate
from sim.serving import ServingModel, SharedEngine
from submission.attempts import AttemptRecord, read_log
from submission.reasoning.profile import Profile
from submission.grid.profile import GridProfile
from submission.grid.queue import TaskQueue, task_cost
from submission.grid.rescore import Candidate as GridCandidate
from submission.merge import grid_candidates, merged_answers
from submission.profiles import MERGE_S, BothProfile, line_configs, load_grid_profile
from submission.schedule import InputInfo, ScheduleConfig
from submission.selection import Candidates
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
        first = [r for r in group if r.attempt == 1][-1]  # a task redone after a kill: its last records
        detail = first.grid_line
        right = 0.0
        if task.test_outputs is not None:
            hits = {r.test_index for r in group if r.grid is not None and r.grid == task.test_outputs[r.test_index]}
            right = len(hits) / len(task.test_inputs)
        used = sum(detail.stage_s.values()) / max(detail.time_limit_s, 1e-9)
        out.append(LoggedTask(task_id, task_cost(task), min(used, 1.0), right, detail.stage_s))
    return out


@dataclass(frozen=True)
class RunForecast:
    score: float  # percent, task-weighted
    answered: int
    tasks: int
    answered_ids: frozenset = frozenset()  # the drawn tasks ("t0", ...) answered by the deadline
    short_training: int = 0  # tasks started whose training the forecast cut to its share (queue.TrainingPlan)


def draw_tasks(logged: list[LoggedTask], hidden_tasks: int, rng: random.Random) -> dict[str, LoggedTask]:
    return {f"t{i}": rng.choice(logged) for i in range(hidden_tasks)}


def one_run(logged: list[LoggedTask], profile: GridProfile, hidden_tasks: int, rng: random.Random,
            drawn: dict[str, LoggedTask] | None = None) -> RunForecast:
    run = profile.run
    drawn = drawn or draw_tasks(logged, hidden_tasks, rng)
    queue = TaskQueue({k: v.cost for k, v in drawn.items()}, run.min_task_s, run.max_task_s, run.max_failures,
                      needs={k: run.task_need(v.cost) for k, v in drawn.items()} if run.task_s else {})
    workers = len(run.devices)
    free: list[tuple[float, int, str | None]] = [(0.0, w, None) for w in range(workers)]  # (when, worker, its task)
    answered, score, short = 0, 0.0, 0
    done: set[str] = set()
    while free:
        free.sort(key=lambda f: (f[0], f[1]))
        now, worker, finished = free.pop(0)
        if finished is not None:
            queue.done(worker, finished)
        nxt = queue.next(worker, now, run.stop_new, run.hard_stop, workers)
        if nxt is None:
            continue
        task_id, limit = nxt
        short += not queue.plans[task_id].full
        end = now + drawn[task_id].used * limit
        if end <= run.hard_stop:  # else it runs until the hard stop: unanswered, and its worker takes no more
            answered += 1
            done.add(task_id)
            score += drawn[task_id].right
            free.append((end, worker, task_id))
    return RunForecast(100 * score / len(drawn), answered, len(drawn), frozenset(done), short)


@dataclass(frozen=True)
class Split:
    """The reasoning line's side of a comparison: its schedule, logged attempts and serving model on all GPUs."""

    schedule: ScheduleConfig
    records: tuple[AttemptRecord, ...]
    serving: ServingModel
    share: float  # of the GPUs the reasoning line gets in the split
    transfer: bool = True  # the reasoning profile's selection.transfer


@dataclass(frozen=True)
class Comparison:
    grid_only: float  # percent, task-weighted, one simulated run
    reasoning_only: float
    both: float


def reasoning_run(split: Split, drawn: dict[str, LoggedTask], tasks: dict[str, Task], share: float,
                  seed: int) -> Candidates:
    """The reasoning line on `share` of its serving model (throughput and KV cache), serving the drawn tasks with
    attempts drawn from their own logged ones (sim.run): the candidates it has per input at its hard stop."""
    truth, inputs, origin, prompts = {}, [], {}, {}
    for record in split.records:
        if record.prompt_tokens:
            prompts[(record.task_id, record.test_index)] = record.prompt_tokens
    for drawn_id, logged in drawn.items():
        task = tasks[logged.task_id]
        origin[drawn_id] = task.id
        for index, label in enumerate(task.test_outputs or ()):
            inputs.append(InputInfo(drawn_id, index, prompts.get((task.id, index), 4000), len(task.test_inputs)))
            truth[(drawn_id, index)] = truth[(task.id, index)] = label
    pool = AttemptPool(list(split.records), truth)

    def draw(request, rng):
        return pool.draw(replace(request, task_id=origin[request.task_id]), rng)

    result = simulate(split.schedule, inputs, draw, SharedEngine(split.serving.scaled(share, share)), truth, seed,
                      split.transfer)
    counts = {i.task_id: i.task_inputs for i in inputs}
    out = Candidates(transfer=split.transfer)
    for request, attempt, _, _ in result.finished:
        out.add(request.task_id, request.test_index, request.attempt, attempt.grid,
                tuple(p[:counts[request.task_id]] for p in attempt.program_candidates), attempt.weak_outputs)
    return out


def task_score(drawn: dict[str, LoggedTask], tasks: dict[str, Task], answers) -> float:
    """Percent, task-weighted: `answers(drawn_id, index)` -> the two attempts."""
    total = 0.0
    for drawn_id, logged in drawn.items():
        labels = tasks[logged.task_id].test_outputs
        total += sum(label in answers(drawn_id, i) for i, label in enumerate(labels)) / len(labels)
    return 100 * total / len(drawn)


def compare(logged: list[LoggedTask], grid_records: list[AttemptRecord], tasks: dict[str, Task],
            grid_all: GridProfile, grid_split: GridProfile, split: Split, hidden_tasks: int,
            rng: random.Random) -> Comparison:
    """One simulated run of each arrangement on the same drawn tasks (module doc)."""
    joint = {r.task_id for r in split.records}
    drawn = draw_tasks([t for t in logged if t.task_id in joint], hidden_tasks, rng)
    seed = rng.getrandbits(32)
    found: dict[tuple[str, int], list[GridCandidate]] = grid_candidates(grid_records)
    grid_alone = one_run(logged, grid_all, hidden_tasks, rng, drawn)
    reasoning_alone = reasoning_run(split, drawn, tasks, 1.0, seed)
    grid_side = one_run(logged, grid_split, hidden_tasks, rng, drawn).answered_ids
    reasoning_side = reasoning_run(split, drawn, tasks, split.share, seed)

    def both(drawn_id: str, index: int):
        grid = found.get((drawn[drawn_id].task_id, index), []) if drawn_id in grid_side else []
        return merged_answers(reasoning_side.by_input.get((drawn_id, index), []), grid)

    return Comparison(grid_alone.score,
                      task_score(drawn, tasks, lambda d, i: reasoning_alone.answers((d, i))),
                      task_score(drawn, tasks, both))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.grid", description=__doc__.split("\n\n")[0])
    parser.add_argument("--log", required=True, type=Path, action="append")
    parser.add_argument("--tasks", required=True, type=Path)
    parser.add_argument("--solutions", type=Path)
    parser.add_argument("--profile", default="grid-4b-4xL4")
    parser.add_argument("--hidden-tasks", type=int, default=240)
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--reasoning-log", type=Path, action="append", help="the reasoning line's log(s), with --both")
    parser.add_argument("--both", help="a combined profile (line = \"both\"): compare it with each line alone")
    parser.add_argument("--serving", type=Path, help="the reasoning line's serving model (sim/serving_models/)")
    args = parser.parse_args(argv)
    if bool(args.reasoning_log) != bool(args.both):
        parser.error("--reasoning-log and --both go together")
    profile = load_grid_profile(args.profile)
    tasks = {t.id: t for t in load_tasks(args.tasks, args.solutions).tasks}
    records = [r for path in args.log for r in read_log(path)]
    logged = logged_tasks(records, tasks)
    if not logged:
        print(f"error: {', '.join(map(str, args.log))}: no grid-line records for these tasks", file=sys.stderr)
        return 2
    rng = random.Random(args.seed)
    if args.both:
        return print_comparison(args, profile, tasks, logged, records, rng)
    runs = [one_run(logged, profile, args.hidden_tasks, rng) for _ in range(args.runs)]
    print(f"{len(logged)} logged tasks, {args.runs} runs of {args.hidden_tasks} tasks on {len(profile.run.devices)} "
          f"workers ({profile.name})")
    print(f"forecast score {spread([r.score for r in runs])}; answered by the deadline "
          f"{statistics.mean(r.answered for r in runs):.1f} of {args.hidden_tasks}; training cut short by the "
          f"forecast (fewer steps than sequences may run) in {statistics.mean(r.short_training for r in runs):.1f} "
          f"of them")
    stages = sorted({k for t in logged for k in t.stage_s})
    print("logged seconds by stage (mean per task): " + ", ".join(
        f"{k} {statistics.mean(t.stage_s.get(k, 0.0) for t in logged):.1f}" for k in stages))
    return 0


def spread(scores: list[float]) -> str:
    """Simulated runs' scores as printed: the mean and the 5th to 95th percentile."""
    ranked = sorted(scores)
    low, high = ranked[int(0.05 * (len(ranked) - 1))], ranked[int(0.95 * (len(ranked) - 1))]
    return f"{statistics.mean(ranked):.2f} (5-95%: {low:.2f}-{high:.2f})"


def split_lines(both: BothProfile) -> tuple[Profile, GridProfile, float]:
    """The combined run's two lines as the run starts them (submission.profiles.line_configs, with its model,
    tensor-parallel, worker and max_len overrides, at the lines' time limit: the run's less MERGE_S) and the reasoning
    line's share of the GPUs (its engine's tensor x pipeline parallel size against the grid line's workers)."""
    reasoning, grid = line_configs(both, both.time_limit_s - MERGE_S)
    gpus = reasoning.engine.tensor_parallel_size * reasoning.engine.pipeline_parallel_size
    return reasoning, grid, gpus / (gpus + len(grid.run.devices))


def print_comparison(args: argparse.Namespace, grid_all: GridProfile, tasks: dict[str, Task],
                     logged: list[LoggedTask], grid_records: list[AttemptRecord], rng: random.Random) -> int:
    from sim.scenario import SERVING_MODELS, for_profile
    from sim.serving import load_serving
    from submission.profiles import load_both_profile

    both = load_both_profile(args.both)
    reasoning, grid_split, share = split_lines(both)
    records = tuple(r for path in args.reasoning_log for r in read_log(path) if r.task_id in tasks)
    joint = {r.task_id for r in records} & {t.task_id for t in logged}
    if not joint:
        print("error: no task is in both lines' logs", file=sys.stderr)
        return 2
    # with the line's chunked-prefill budget and draft tokens, as a forecast has them
    serving = for_profile(load_serving(args.serving or SERVING_MODELS / f"{Path(both.reasoning.profile).stem}.toml"),
                          reasoning)
    split = Split(reasoning.schedule, records, serving, share, reasoning.selection.transfer)
    runs = [compare(logged, grid_records, tasks, grid_all, grid_split, split, args.hidden_tasks, rng)
            for _ in range(args.runs)]
    print(f"{len(joint)} tasks in both logs; {args.runs} runs of {args.hidden_tasks} tasks; the split "
          f"({both.name}): the reasoning line on {share:.0%} of the GPUs, the grid line on "
          f"{len(grid_split.run.devices)} workers")
    for name, value in (("all GPUs to the grid line", lambda c: c.grid_only),
                        ("all GPUs to the reasoning line", lambda c: c.reasoning_only),
                        (f"the split, answers merged ({both.name})", lambda c: c.both)):
        print(f"{name}: forecast score {spread([value(c) for c in runs])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
