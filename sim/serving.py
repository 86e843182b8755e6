"""The serving model: how fast an engine turns running requests into tokens, on a simulated clock.

Decode step time for n running requests holding K context tokens in total:  t(n, K) = a + b*n + c*K  seconds.
Every step gives each running request one token, so total throughput n / t(n, K) saturates as n grows and the
per-stream rate 1 / t(n, K) falls as contexts grow. A newly admitted request first costs `prefill_s_per_token` x its
prompt tokens, during which no stream advances (vLLM mixes prefill into decode steps; a stall of the same total is the
approximation). Admission is limited by `max_num_seqs` and by the KV cache: a running request reserves prompt + cap +
answer tokens of `kv_tokens`. The engine starts `startup_s` after the run. Fitted from a real run by `sim calibrate`.

Between two events (an admission or a completion) the batch is fixed, so the time of the next completion is exact:
after s steps K has grown by n*s, and s steps take s*(a + b*n + c*K) + c*n*s*(s-1)/2. A 12-hour run simulates in a few
thousand events, not millions of steps.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields
from pathlib import Path


@dataclass(frozen=True)
class ServingModel:
    step_a: float  # seconds per decode step, fixed
    step_b: float  # seconds per step per running request
    step_c: float  # seconds per step per context token held by the running requests
    prefill_s_per_token: float
    startup_s: float
    kv_tokens: int  # KV-cache capacity, tokens
    max_num_seqs: int

    def step_time(self, n: int, context: float) -> float:
        return self.step_a + self.step_b * n + self.step_c * context

    def scaled(self, throughput: float = 1.0, kv: float = 1.0) -> ServingModel:
        """The same engine `throughput` times faster and with `kv` times the cache (sensitivity runs)."""
        return ServingModel(self.step_a / throughput, self.step_b / throughput, self.step_c / throughput,
                            self.prefill_s_per_token / throughput, self.startup_s, int(self.kv_tokens * kv),
                            self.max_num_seqs)


def load_serving(path: str | Path) -> ServingModel:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ValueError(f"{path}: cannot read the serving model: {err}") from None
    names = {f.name for f in fields(ServingModel)}
    unknown, missing = sorted(set(raw) - names), sorted(names - set(raw))
    if unknown or missing:
        raise ValueError(f"{path}: unknown keys {unknown}, missing keys {missing}")
    return ServingModel(**raw)


@dataclass
class Job:
    """One request inside the simulated engine. `payload` is whatever the caller needs back at the end."""

    key: tuple
    prompt: int
    tokens: int  # tokens it will generate (thinking + answer)
    reserve: int  # KV tokens reserved while it runs
    payload: object = None
    generated: int = 0
    started: float = math.nan  # admitted (after its prefill)


@dataclass
class SharedEngine:
    """Continuous batching on a simulated clock (see the module doc)."""

    model: ServingModel
    now: float = 0.0
    waiting: list[Job] = field(default_factory=list)
    running: list[Job] = field(default_factory=list)
    reserved: int = 0
    context: float = 0.0
    tokens: int = 0  # generated so far, all jobs
    timeline: list[tuple[float, int, float]] = field(default_factory=list)  # (time, running, tokens/s)

    def __post_init__(self) -> None:
        self.now = max(self.now, self.model.startup_s)

    def submit(self, job: Job, now: float) -> None:
        if job.reserve > self.model.kv_tokens:
            raise ValueError(f"request {job.key} reserves {job.reserve} KV tokens, the cache holds "
                             f"{self.model.kv_tokens}")
        self.waiting.append(job)

    def _admit(self) -> None:
        while (self.waiting and len(self.running) < self.model.max_num_seqs
               and self.reserved + self.waiting[0].reserve <= self.model.kv_tokens):
            job = self.waiting.pop(0)
            self.now += self.model.prefill_s_per_token * job.prompt
            self.reserved += job.reserve
            self.context += job.prompt
            job.started = self.now
            self.running.append(job)

    def advance(self, now: float, limit: float) -> tuple[float, list[Job]]:
        """Run to the next completion (or to `limit`); return the time and the jobs that finished then."""
        self.now = max(self.now, now)
        self._admit()
        if not self.running:
            return math.inf, []
        n = len(self.running)
        steps = min(j.tokens - j.generated for j in self.running)
        per_step = self.model.step_time(n, self.context)
        self.timeline.append((self.now, n, n / per_step))
        duration = steps * per_step + self.model.step_c * n * steps * (steps - 1) / 2
        if self.now + duration > limit:  # stop at the limit: advance whole steps only
            steps = self._steps_within(limit - self.now, n, per_step)
            duration = steps * per_step + self.model.step_c * n * steps * (steps - 1) / 2
            self._generate(steps, n)
            self.now += duration
            return math.inf, []
        self._generate(steps, n)
        self.now += duration
        done = [j for j in self.running if j.generated >= j.tokens]
        for job in done:
            self.running.remove(job)
            self.reserved -= job.reserve
            self.context -= job.prompt + job.generated
        return self.now, done

    def _generate(self, steps: int, n: int) -> None:
        for job in self.running:
            job.generated += steps
        self.context += n * steps
        self.tokens += n * steps

    def _steps_within(self, seconds: float, n: int, per_step: float) -> int:
        """The most whole steps that fit in `seconds` (solving the quadratic step-time sum)."""
        q = self.model.step_c * n / 2
        if q == 0:
            return max(int(seconds / per_step), 0)
        lin = per_step - q
        return max(int((-lin + math.sqrt(lin * lin + 4 * q * seconds)) / (2 * q)), 0)

    def abort_all(self) -> list[Job]:
        jobs = self.running + self.waiting
        self.running, self.waiting, self.reserved, self.context = [], [], 0, 0.0
        return jobs
