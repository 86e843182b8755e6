"""Forecasts: many simulated runs, intervals, sensitivity, and the inputs a forecast runs on. Pure but for the clock-free
simulation itself (no I/O).

- Score interval over the randomness of attempts and throughput: `runs` simulations, each with its own seed for the
  draws and a throughput factor exp(N(0, throughput_noise)); the 5th and 95th percentiles of their scores.
- Score interval over tasks: per-task scores averaged over the runs, resampled over tasks 1,000 times (bootstrap).
- Sensitivity: paired runs with common seeds, once with the engine (1 + delta) times faster and once with (1 + delta)
  times the KV cache, against the base; the mean score difference in points per percent.
"""

from __future__ import annotations

import math
import random
import statistics
from dataclasses import dataclass

from sim.pool import AttemptPool
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

    def mean(self, value) -> float:
        return statistics.fmean(value(r) for r in self.results)


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    position = (len(ordered) - 1) * q
    low, high = math.floor(position), math.ceil(position)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def build_inputs(tasks: list[Task], prompt_tokens: dict[tuple[str, int], int], hidden_tasks: int,
                 rng: random.Random) -> tuple[list[InputInfo], dict[tuple[str, int], object]]:
    """The simulated task set: the labelled tasks, plus made-up tasks up to `hidden_tasks` (the hidden set is larger
    than the public one) whose test-input counts and prompt lengths are drawn from the real ones. Returns the inputs
    and the true answer of each (a label, or a stand-in)."""
    inputs, truth = [], {}
    lengths = list(prompt_tokens.values()) or [4000]
    for task in tasks:
        for index, label in enumerate(task.test_outputs or ()):
            key = (task.id, index)
            inputs.append(InputInfo(task.id, index, prompt_tokens.get(key, rng.choice(lengths)), len(task.test_inputs)))
            truth[key] = label
    for number in range(max(hidden_tasks - len(tasks), 0)):
        task_id = f"made-up-{number:04d}"
        count = len(rng.choice(tasks).test_inputs)
        for index in range(count):
            inputs.append(InputInfo(task_id, index, rng.choice(lengths), count))
            truth[(task_id, index)] = (("right", task_id, index),)
    return inputs, truth


def one_run(config: ScheduleConfig, inputs: list[InputInfo], truth: dict, pool: AttemptPool, serving: ServingModel,
            seed: int, throughput: float = 1.0, kv: float = 1.0) -> tuple[SimResult, SharedEngine]:
    engine = SharedEngine(serving.scaled(throughput, kv))
    result = simulate(config, inputs, pool.draw, engine, truth, random.Random(seed))
    return result, engine


def forecast(config: ScheduleConfig, inputs: list[InputInfo], truth: dict, pool: AttemptPool,
             serving: ServingModel, runs: int = 50, seed: int = 0, throughput_noise: float = 0.1,
             bootstraps: int = 1000) -> Forecast:
    noise = random.Random(seed)
    results = []
    for run in range(runs):
        factor = math.exp(noise.gauss(0.0, throughput_noise)) if throughput_noise else 1.0
        results.append(one_run(config, inputs, truth, pool, serving, seed + run, factor)[0])
    scores = [r.score for r in results]
    per_task = {t: statistics.fmean(r.task_scores[t] for r in results) for t in results[0].task_scores}
    values = list(per_task.values())
    boot = random.Random(seed + 1)
    means = [100 * statistics.fmean(boot.choices(values, k=len(values))) for _ in range(bootstraps)]
    return Forecast(statistics.fmean(scores), (percentile(scores, 0.05), percentile(scores, 0.95)),
                    (percentile(means, 0.05), percentile(means, 0.95)), tuple(results))


def sensitivity(config: ScheduleConfig, inputs: list[InputInfo], truth: dict, pool: AttemptPool,
                serving: ServingModel, runs: int = 20, seed: int = 0, delta: float = 0.10) -> dict[str, float]:
    """Points of score per percent more throughput and per percent more KV cache (paired, common seeds)."""
    out = {}
    for name, scale in (("throughput", dict(throughput=1 + delta)), ("kv_cache", dict(kv=1 + delta))):
        diffs = []
        for run in range(runs):
            base = one_run(config, inputs, truth, pool, serving, seed + run)[0].score
            diffs.append(one_run(config, inputs, truth, pool, serving, seed + run, **scale)[0].score - base)
        out[name] = statistics.fmean(diffs) / (100 * delta)
    return out
