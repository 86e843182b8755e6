"""Forecasts: many simulated runs, intervals, sensitivity, and the inputs a forecast runs on. Pure but for the clock-free
simulation itself (no I/O).

- Score interval over the randomness of attempts (and throughput, if asked): `runs` simulations, each with its own
  seed for the draws and, with `throughput_noise` > 0, a speed factor exp(N(0, throughput_noise)) on the whole engine
  (it models run-to-run variation of the hardware's speed that the serving model does not know: another machine of the
  same type, a different mix of prompts; off by default); the 5th and 95th percentiles of their scores.
- Score interval over tasks: per-task scores averaged over the runs, resampled over tasks `bootstraps` times.
- Sensitivity: `pairs` paired runs with common random numbers (the same seed, so every slot draws the same attempt:
  sim.run), once with the engine (1 + step) times faster and once with (1 + step) times the KV cache, against the
  base; the mean score difference in points per percent, with its paired standard error (stdev / sqrt(pairs)).

Runs are independent and seeded, so `workers` processes (`python -m sim forecast --workers`, all cores by default)
give the same results as one: they are forked with the task set and the pool, and send back only their results.
"""

from __future__ import annotations

import gc
import io
import math
import multiprocessing
import pickle
import random
import statistics
from dataclasses import dataclass

from sim.pool import AttemptPool, SimAttempt
from sim.run import SimResult, simulate
from sim.serving import ServingModel, SharedEngine
from submission.schedule import InputInfo, ScheduleConfig
from submission.tasks import Task


@dataclass(frozen=True)
class Forecast:
    score: float  # mean over runs
    runs_interval: tuple[float, float]  # 90%, over attempts and throughput
    tasks_interval: tuple[float, float]  # 90%, bootstrap over tasks
    results: tuple[SimResult, ...]
    seeds: tuple[int, ...]  # run i's seed and speed factor: one_run(..., seeds[i], factors[i]) repeats it
    factors: tuple[float, ...]

    def median_run(self) -> int:
        """The index of a run with the median score (the timeline plot shows it)."""
        order = sorted(range(len(self.results)), key=lambda i: self.results[i].score)
        return order[len(order) // 2]

    def mean(self, value) -> float:
        return statistics.fmean(value(r) for r in self.results)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def build_inputs(tasks: list[Task], prompt_tokens: dict[tuple[str, int], int], hidden_tasks: int,
                 rng: random.Random, test_inputs: int | None = None,
                 inputs_per_task: tuple[tuple[int, float], ...] = ()
                 ) -> tuple[list[InputInfo], dict[tuple[str, int], object]]:
    """The simulated task set: the labelled tasks, plus made-up tasks up to `hidden_tasks` (the hidden set is larger
    than the public one) whose prompt lengths are drawn from the real ones and test-input counts from the real tasks,
    or from `inputs_per_task` ((count, weight), ...) when given; with `test_inputs`, the made-up tasks' counts (1-4)
    are then adjusted one at a time until the set has that many inputs. Returns the inputs and the true answer of each
    (a label, or a stand-in)."""
    inputs, truth = [], {}
    lengths = list(prompt_tokens.values()) or [4000]
    for task in tasks:
        for index, label in enumerate(task.test_outputs or ()):
            key = (task.id, index)
            inputs.append(InputInfo(task.id, index, prompt_tokens.get(key, rng.choice(lengths)), len(task.test_inputs)))
            truth[key] = label
    made_up = max(hidden_tasks - len(tasks), 0)
    if inputs_per_task:
        counts = rng.choices([c for c, _ in inputs_per_task], [w for _, w in inputs_per_task], k=made_up)
    else:
        counts = [len(rng.choice(tasks).test_inputs) for _ in range(made_up)]
    if test_inputs is not None:
        real = len(inputs)
        if not real + len(counts) <= test_inputs <= real + 4 * len(counts):
            raise ValueError(f"test inputs: {test_inputs} cannot be reached with {len(tasks)} labelled tasks "
                             f"({real} inputs) and {len(counts)} made-up tasks of 1-4 inputs")
        while real + sum(counts) != test_inputs:
            step = 1 if real + sum(counts) < test_inputs else -1
            index = rng.choice([i for i, c in enumerate(counts) if 1 <= c + step <= 4])
            counts[index] += step
    for number, count in enumerate(counts):
        task_id = f"made-up-{number:04d}"
        for index in range(count):
            inputs.append(InputInfo(task_id, index, rng.choice(lengths), count))
            truth[(task_id, index)] = (("right", task_id, index),)
    return inputs, truth


def one_run(config: ScheduleConfig, inputs: list[InputInfo], truth: dict, pool: AttemptPool, serving: ServingModel,
            seed: int, throughput: float = 1.0, kv: float = 1.0, *, transfer: bool = True
            ) -> tuple[SimResult, SharedEngine]:
    engine = SharedEngine(serving.scaled(throughput, kv))
    result = simulate(config, inputs, pool.draw, engine, truth, seed, transfer)
    return result, engine


_WORLD: tuple = ()  # what forked workers run on: set before the fork, so it is inherited, not sent
_LOGGED: dict[int, int] = {}  # id -> index of the pool's logged attempts, the same objects on both sides of the fork


class _ResultPickler(pickle.Pickler):
    """Sends a logged attempt (most of a result's bytes: its grids) as its index in the pool both sides hold."""

    def reducer_override(self, obj):
        index = _LOGGED.get(id(obj)) if type(obj) is SimAttempt else None
        return NotImplemented if index is None else (_logged, (index,))


def _logged(index: int) -> SimAttempt:
    return _WORLD[3].logged[index]


def _result(run: tuple[int, float, float]) -> bytes:
    out = io.BytesIO()
    _ResultPickler(out, pickle.HIGHEST_PROTOCOL).dump(one_run(*_WORLD[:5], *run, transfer=_WORLD[5])[0])
    return out.getvalue()


def run_many(config: ScheduleConfig, inputs: list[InputInfo], truth: dict, pool: AttemptPool,
             serving: ServingModel, runs: list[tuple[int, float, float]], workers: int = 1,
             transfer: bool = True) -> list[SimResult]:
    """one_run for each (seed, throughput, kv), in order, on up to `workers` forked processes.

    Python's cycle collector is off meanwhile (in the workers too): a run makes no reference cycles (tests/
    test_sim_golden.py checks), so it would find nothing, yet its passes over the growing list of results cost ~10% of
    a thousand runs."""
    global _WORLD, _LOGGED
    workers = min(workers, len(runs))
    collecting = gc.isenabled()
    gc.disable()
    try:
        if workers <= 1:
            return [one_run(config, inputs, truth, pool, serving, *run, transfer=transfer)[0] for run in runs]
        _WORLD = (config, inputs, truth, pool, serving, transfer)
        _LOGGED = {id(attempt): index for index, attempt in enumerate(pool.logged)}
        with multiprocessing.get_context("fork").Pool(workers) as processes:  # unpickled as they come, in order
            return [pickle.loads(sent) for sent in processes.imap(_result, runs, max(1, len(runs) // (8 * workers)))]
    finally:
        _WORLD, _LOGGED = (), {}
        if collecting:
            gc.enable()


def forecast(config: ScheduleConfig, inputs: list[InputInfo], truth: dict, pool: AttemptPool,
             serving: ServingModel, runs: int = 50, seed: int = 0, throughput_noise: float = 0.0,
             bootstraps: int = 1000, workers: int = 1, transfer: bool = True) -> Forecast:
    if runs < 1:
        raise ValueError("runs: at least one simulated run is needed")
    noise = random.Random(seed)
    factors = [math.exp(noise.gauss(0.0, throughput_noise)) if throughput_noise else 1.0 for _ in range(runs)]
    results = run_many(config, inputs, truth, pool, serving,
                       [(seed + run, factors[run], 1.0) for run in range(runs)], workers, transfer)
    scores = [r.score for r in results]
    per_task = {t: statistics.fmean(r.task_scores[t] for r in results) for t in results[0].task_scores}
    values = list(per_task.values())
    boot = random.Random(seed + 1)
    means = [100 * statistics.fmean(boot.choices(values, k=len(values))) for _ in range(bootstraps)] or [
        100 * statistics.fmean(values)]
    return Forecast(statistics.fmean(scores), (percentile(scores, 0.05), percentile(scores, 0.95)),
                    (percentile(means, 0.05), percentile(means, 0.95)), tuple(results),
                    tuple(seed + run for run in range(runs)), tuple(factors))


@dataclass(frozen=True)
class Sensitivity:
    """Score points per +1% of one resource: the mean of paired differences and its standard error."""

    resource: str  # "throughput" or "kv_cache"
    per_percent: float
    standard_error: float
    step: float
    pairs: int


def sensitivity(config: ScheduleConfig, inputs: list[InputInfo], truth: dict, pool: AttemptPool,
                serving: ServingModel, pairs: int = 20, seed: int = 0, step: float = 0.05,
                workers: int = 1, transfer: bool = True) -> list[Sensitivity]:
    """Points of score per percent more throughput and per percent more KV cache (paired, common random numbers)."""
    if pairs < 2 or step <= 0:
        raise ValueError("sensitivity: at least 2 pairs and a positive step are needed")
    scales = ((1.0, 1.0), (1 + step, 1.0), (1.0, 1 + step))  # base, throughput, cache
    results = run_many(config, inputs, truth, pool, serving,
                       [(seed + run, t, kv) for t, kv in scales for run in range(pairs)], workers, transfer)
    base = [r.score for r in results[:pairs]]
    out = []
    for index, name in ((1, "throughput"), (2, "kv_cache")):
        diffs = [r.score - b for r, b in zip(results[index * pairs:(index + 1) * pairs], base)]
        out.append(Sensitivity(name, statistics.fmean(diffs) / (100 * step),
                               statistics.stdev(diffs) / math.sqrt(pairs) / (100 * step), step, pairs))
    return out
