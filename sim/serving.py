"""The serving model: how an engine turns running requests into tokens, and how its KV cache decides what runs.

Speed. A decode step with n running requests holding K context tokens in total takes  t(n, K) = a + b*n + c*K
seconds and gives each running request one token: total throughput n / t(n, K) saturates as n grows and the per-stream
rate 1 / t(n, K) falls as contexts grow. A (re)admitted request first costs `prefill_s_per_token` x the tokens it must
prefill, during which no stream advances (vLLM mixes prefill into decode steps; a stall of the same total is the
approximation). The engine starts `startup_s` after the run. Fitted from a real run by `sim calibrate`.

Cache, as vLLM's v1 scheduler manages it (vllm/v1/core/sched/scheduler.py, kv_cache_manager.py; checked against the
CPU engine by tests/test_sim_fidelity.py). The cache is `kv_tokens // block_size` blocks. A request of P prompt
tokens that has generated g tokens needs ceil((P + g) / block_size) blocks for the step that produces token g + 1:
blocks are taken as it grows, never reserved for its cap. Every step, the running requests take their blocks first,
oldest first; when one cannot, the most recently admitted running request is preempted (recompute): its blocks are
freed and it goes back to the front of the waiting queue keeping its generated tokens, which it re-prefills (P + g
tokens) when it is admitted again. Waiting requests are admitted in order while fewer than `max_num_seqs` run and
their blocks fit with `watermark` x the cache left free (vLLM's scheduler watermark, 0 by default; not applied when
nothing else runs); not in a step that preempted. Not modelled: prefix caching
(the shipped profiles run without it), speculative decoding's look-ahead blocks, chunked prefill's token budget.

Between two events (an admission, a completion, a preemption) the batch is fixed, so the next event is solved, not
stepped: after s steps K has grown by n*s, and s steps take s*(a + b*n + c*K) + c*n*s*(s-1)/2; the step at which the
blocks run out is found from where each request crosses its next block boundary. A 12-hour run is a few thousand
events, not millions of steps.
"""

from __future__ import annotations

import heapq
import math
import tomllib
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path


@dataclass(frozen=True)
class ServingModel:
    step_a: float  # seconds per decode step, fixed
    step_b: float  # seconds per step per running request
    step_c: float  # seconds per step per context token held by the running requests
    prefill_s_per_token: float
    startup_s: float
    kv_tokens: int  # KV-cache capacity, tokens (blocks x block size)
    max_num_seqs: int
    block_size: int = 16  # tokens per KV block: vLLM's default on GPUs; the engine log's cache line says yours
    watermark: float = 0.0  # share of the blocks an admission must leave free (vLLM: scheduler watermark, default 0)

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.kv_tokens < self.block_size or self.max_num_seqs < 1:
            raise ValueError("serving model: block_size, kv_tokens (>= one block) and max_num_seqs must be positive")
        if not 0 <= self.watermark < 1:
            raise ValueError("serving model: watermark must be in [0, 1)")

    @property
    def blocks(self) -> int:
        return self.kv_tokens // self.block_size

    def step_time(self, n: int, context: float) -> float:
        return self.step_a + self.step_b * n + self.step_c * context

    def scaled(self, throughput: float = 1.0, kv: float = 1.0) -> ServingModel:
        """The same engine `throughput` times faster and with `kv` times the cache (sensitivity runs)."""
        return replace(self, step_a=self.step_a / throughput, step_b=self.step_b / throughput,
                       step_c=self.step_c / throughput, prefill_s_per_token=self.prefill_s_per_token / throughput,
                       kv_tokens=max(int(self.kv_tokens * kv), self.block_size))

    def throughput(self, running: int, context_per_request: float) -> float:
        """Total decode tokens/s with `running` requests of `context_per_request` tokens each."""
        return running / self.step_time(running, running * context_per_request)


def load_serving(path: str | Path) -> ServingModel:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ValueError(f"{path}: cannot read the serving model: {err}") from None
    names = {f.name for f in fields(ServingModel)}
    required = {f.name for f in fields(ServingModel) if f.default is MISSING}
    unknown, missing = sorted(set(raw) - names), sorted(required - set(raw))
    if unknown or missing:
        raise ValueError(f"{path}: unknown keys {unknown}, missing keys {missing}")
    try:
        return ServingModel(**raw)
    except (TypeError, ValueError) as err:
        raise ValueError(f"{path}: {err}") from None


@dataclass(eq=False, slots=True)  # identity: the engine keys its running requests by job; equality is slow
class Job:
    """One request inside the simulated engine. `payload` is whatever the caller needs back at the end."""

    key: tuple
    prompt: int
    tokens: int  # tokens it will generate (thinking + answer)
    payload: object = None
    generated: int = 0  # while it runs, the engine's step count minus `base` (kept up to date when it stops)
    submitted: float = math.nan
    started: float = math.nan  # first admitted (after its prefill)
    preemptions: int = 0
    base: int = 0  # while running: the engine's step count when it had generated nothing
    admitted: int = -1  # while running: its admission number (its place in the running order)


@dataclass(frozen=True)
class Sample:
    """The engine at one event: what the timeline plot shows."""

    time: float
    running: int
    tokens_per_s: float
    blocks_used: int
    waiting: int


@dataclass
class SharedEngine:
    """Continuous batching and a paged KV cache on a simulated clock (see the module doc).

    Every running request gains a token per step, so none is touched between events: the engine counts its steps,
    a running request's generated tokens are that count minus its `base`, and a heap of finishing steps gives the next
    completion. A pass over the running requests is made only when the cache could fill before it."""

    model: ServingModel
    now: float = 0.0
    waiting: list[Job] = field(default_factory=list)
    running: dict[Job, None] = field(default_factory=dict)  # in admission order: the last is preempted first
    context: float = 0.0
    tokens: int = 0  # generated so far, all jobs
    prefilled: int = 0  # prompt tokens prefilled, re-prefills after preemption included
    timeline: list[Sample] = field(default_factory=list)
    preempted: list[tuple[float, tuple, int]] = field(default_factory=list)  # (time, job key, tokens it had)
    _no_admission: bool = False  # the step after a preemption admits nothing (as vLLM)
    _steps: int = 0  # decode steps taken
    _admissions: int = 0
    _finishing: list[tuple[int, int, Job]] = field(default_factory=list)  # heap: (step it finishes at, admitted, job)

    def __post_init__(self) -> None:
        self.now = max(self.now, self.model.startup_s)
        self._size, self._total = self.model.block_size, self.model.blocks  # read at every event

    def submit(self, job: Job, now: float) -> None:
        if job.prompt + job.tokens > self.model.kv_tokens:
            raise ValueError(f"request {job.key} needs {job.prompt + job.tokens} KV tokens, the cache holds "
                             f"{self.model.kv_tokens}")
        job.submitted = now
        self.waiting.append(job)

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self._size)

    def _used(self) -> int:
        """Blocks the running requests need for their next step."""
        size, steps = self._size, self._steps
        return sum([(j.prompt + steps - j.base + size - 1) // size for j in self.running])

    def _used_bound(self, steps: int = 0) -> float:
        """An upper bound of the blocks needed `steps` steps from now, without a pass over the requests: each
        request's tokens rounded up to a whole block cost at most block_size - 1 more."""
        n, size = len(self.running), self._size
        return (self.context + n * (steps + size - 1)) / size

    def _admit(self) -> None:
        """Admit waiting requests in order while they fit (the exact block count only when the bound is too close)."""
        if self._no_admission:
            self._no_admission = False
            return
        keep = int(self.model.watermark * self._total)
        used = None
        while self.waiting and len(self.running) < self.model.max_num_seqs:
            job = self.waiting[0]
            prefill = job.prompt + job.generated
            need = self._blocks(prefill)
            limit = self._total - (keep if self.running else 0)  # vLLM: no watermark for a lone request
            if used is None and self._used_bound() + need > limit:
                used = self._used()
            if used is not None and used + need > limit:
                break
            self.waiting.pop(0)
            if used is not None:
                used += need
            self.now += self.model.prefill_s_per_token * prefill
            self.prefilled += prefill
            self.context += prefill
            if math.isnan(job.started):
                job.started = self.now
            job.base, job.admitted = self._steps - job.generated, self._admissions
            self._admissions += 1
            self.running[job] = None
            heapq.heappush(self._finishing, (job.base + job.tokens, job.admitted, job))

    def _steps_before_full(self, used: int) -> int:
        """Whole steps the running requests (holding `used` blocks for their next step) can take before one of them
        finds no free block."""
        size, steps = self._size, self._steps
        # Request i next needs a new block after (size - (L_i - 1) % size) steps (L_i its tokens), then every `size`
        # steps: the (free + 1)-th crossing over all requests is the first step that cannot be served.
        crossings = sorted([size - (j.prompt + steps - j.base - 1) % size for j in self.running])
        cycle, position = divmod(self._total - used, len(crossings))
        return crossings[position] + cycle * size

    def _next_finish(self) -> int:
        """Steps to the next completion (entries of preempted requests are dropped on the way)."""
        heap = self._finishing
        while heap[0][1] != heap[0][2].admitted:
            heapq.heappop(heap)
        return heap[0][0] - self._steps

    def advance(self, now: float, limit: float) -> tuple[float, list[Job]]:
        """Run to the next completion (or to `limit`); return the time and the jobs that finished then."""
        self.now = max(self.now, now)
        while True:
            if self.waiting:
                self._admit()
            if not self.running:
                return math.inf, []
            n = len(self.running)
            to_finish = self._next_finish()
            if self._used_bound(to_finish - 1) <= self._total:  # room to the next completion: no pass needed
                steps, used = to_finish, math.ceil(self.context / self._size)
            else:
                used = self._used()
                steps = min(to_finish, self._steps_before_full(used))
            per_step = self.model.step_time(n, self.context)
            self.timeline.append(Sample(self.now, n, n / per_step, used, len(self.waiting)))
            duration = steps * per_step + self.model.step_c * n * steps * (steps - 1) / 2
            if self.now + duration > limit:  # stop at the limit: advance whole steps only
                steps = min(self._steps_within(limit - self.now, n, per_step), steps)
                self._generate(steps, n)
                self.now += steps * per_step + self.model.step_c * n * steps * (steps - 1) / 2
                return math.inf, []
            self._generate(steps, n)
            self.now += duration
            if steps == to_finish:
                break
            self._preempt()
        done = []
        heap = self._finishing
        while heap and heap[0][0] <= self._steps:  # in admission order, as they are running
            _, admitted, job = heapq.heappop(heap)
            if admitted == job.admitted:
                done.append(job)
        for job in done:
            self._stop(job)
        return self.now, done

    def _stop(self, job: Job) -> None:
        """Take a job off the running requests, its generated tokens brought up to date."""
        del self.running[job]
        job.generated, job.admitted = self._steps - job.base, -1
        self.context -= job.prompt + job.generated

    def _preempt(self) -> None:
        """The next step does not fit: preempt the newest running requests until it does (vLLM's recompute)."""
        used = self._used()
        while used > self._total:
            job = next(reversed(self.running))
            self._stop(job)
            used -= self._blocks(job.prompt + job.generated)
            job.preemptions += 1
            self.preempted.append((self.now, job.key, job.generated))
            self.waiting.insert(0, job)
        self._no_admission = True

    def _generate(self, steps: int, n: int) -> None:
        self._steps += steps
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
        running = list(self.running)
        for job in running:
            self._stop(job)
        jobs = running + self.waiting
        self.waiting, self.context, self._finishing = [], 0.0, []
        return jobs
