"""The serving model: how an engine turns running requests into tokens, and how its KV cache decides what runs.

Speed. A decode step with n running requests holding K context tokens in total takes  t(n, K) = a + b*n + c*K
seconds and gives each running request one token: total throughput n / t(n, K) saturates as n grows and the per-stream
rate 1 / t(n, K) falls as contexts grow. Prefilling costs `prefill_s_per_token` x the tokens prefilled, added to the
step that prefills them (without a token budget a (re)admitted request prefills its whole context in its first step).
The engine starts `startup_s` after the run. Fitted from a real run by `sim calibrate`. In place of the step model a
`Trace` replays a run's measured seconds per step, window by window (`sim backtest --trace`): the cross-check of the
step model on the same log; the measured seconds hold the prefills, so none is added.

Cache, as vLLM's v1 scheduler manages it (vllm/v1/core/sched/scheduler.py, kv_cache_manager.py; checked against the
CPU engine by tests/test_sim_fidelity.py). The cache is `kv_tokens // block_size` blocks (vLLM's pool less its null
block). A request of P prompt tokens that has generated g tokens needs ceil((P + g + 2k) / block_size) blocks for
the step that produces token g + 1, k being `draft_tokens` (speculative decoding: the step computes the k drafts it
verifies, and vLLM's num_lookahead_tokens reserves k more slots for the drafter; 0 without drafts): blocks are taken
as it grows, never reserved for its cap. Every step, the running requests take their blocks first, oldest first;
when one cannot, the most recently admitted running request is preempted (recompute): its blocks are freed and it
goes back to the front of the waiting queue keeping its generated tokens, which it re-prefills (P + g tokens) when it
is admitted again (vLLM 0.33: scheduler.py ~960-975 takes self.running[-1]; _preempt_request ~1799-1843 frees its
blocks, sets num_computed_tokens to 0 and prepends it to the waiting queue).
Waiting requests are admitted in order while fewer than `max_num_seqs` run and the blocks of their whole context
(vLLM's scheduler_reserve_full_isl, on by default; `reserve_full_isl = false`: of their first chunk only) and of their
first chunk plus k look-ahead tokens are free, with `watermark` x the cache left free (vLLM's scheduler watermark, 0
by default; not applied when nothing else runs); not in a step that preempted.
A hybrid model (a Qwen3-Next: paged keys and values on its full-attention layers, a fixed Gated DeltaNet state on
its linear-attention ones) draws both from one pool: each request also holds `state_blocks` blocks from its admission
to its end (vLLM: one group of linear-attention layers per as many layers as the full-attention group has, 1 +
num_speculative_tokens blocks a group; sim/vllm_cache.py derives them, and the block size and the pool, from the
layout, tests/test_sim_vllm_cache.py checks it against vLLM's own allocator). vLLM's log line "KV cache size: N
tokens" is not the pool: it counts requests at max_model_len with their states (sim.vllm_cache.pool_from_log).
Chunked prefill: with `max_num_batched_tokens` B (0: no budget), a step schedules at most B tokens: each decoding
request's 1 + k first (B must exceed max_num_seqs x (1 + k)), then the request being prefilled, then admissions, each
up to what is left. A request whose context does not fit the budget is admitted with a first chunk and prefilled over
the next steps while the decodes go on (it makes no token until its last chunk); it holds blocks only for what it has
prefilled (plus k), so the decodes may take the rest, and, being the newest, it is the first preempted.
Not modelled: prefix caching (the shipped profiles run without it; with it a hybrid model's states follow
mamba_cache_mode "align", other rules), vLLM's asynchronous scheduling (a request then holds one step more: 1 + k
tokens; under pipeline parallelism 0.33 runs it), drafts accepted (a step gives one token per request; the step
model's rate holds the acceptance, so the cache sees the engine's contexts at a given time in fewer, longer steps),
`long_prefill_token_threshold` (off by default). Assumed, not measured: a serving model's
pool and state blocks (for moe-4xL4 derived by sim.vllm_cache from its layout, within the stride alignment vLLM adds;
the study's engine, a vLLM 0.32 fork, logged 2.5% fewer tokens than that derivation gives).

Between two events (an admission, a completion, a preemption) the batch is fixed, so the next event is solved, not
stepped: after s steps K has grown by n*s, and s steps take s*(a + b*n + c*K) + c*n*s*(s-1)/2; the step at which the
blocks run out is found from where each request crosses its next block boundary. A 12-hour run is a few thousand
events, not millions of steps. Steps that prefill in chunks, and the steps after a preemption or an admission the
token budget held back, are taken one at a time (vLLM may admit in the very next step), but for the run of whole
chunks before a prefill's last, which is one event when the cache holds it.
"""

from __future__ import annotations

import bisect
import heapq
import math
from dataclasses import MISSING, dataclass, field, fields, replace
from pathlib import Path

from submission import strict_toml


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
    # Tokens one step schedules (chunked prefill's budget; 0: none, a whole context prefills in one step). A forecast
    # takes it from the profile's engine.max_num_batched_tokens (sim.scenario.for_profile).
    max_num_batched_tokens: int = 0
    draft_tokens: int = 0  # speculative draft tokens per step (the profile's engine.mtp_speculative_tokens)
    # vLLM's scheduler_reserve_full_isl (on by default in 0.32 and 0.33): a waiting request is admitted only when the
    # blocks of its whole context are free, though it takes only its first chunk's; off: its first chunk's suffice.
    reserve_full_isl: bool = True
    # Blocks of the same pool each request holds from its admission to its end for a fixed per-request state: a
    # hybrid model's linear-attention (Mamba / Gated DeltaNet) layers. vLLM puts those layers in KV-cache groups of
    # as many layers as the full-attention group and gives each group 1 + num_speculative_tokens blocks a request
    # (`state_blocks` below derives it); 0 for a model with attention layers only.
    state_blocks: int = 0

    def __post_init__(self) -> None:
        if self.block_size < 1 or self.kv_tokens < self.block_size or self.max_num_seqs < 1:
            raise ValueError("serving model: block_size, kv_tokens (>= one block) and max_num_seqs must be positive")
        if not 0 <= self.watermark < 1:
            raise ValueError("serving model: watermark must be in [0, 1)")
        if self.draft_tokens < 0 or self.max_num_batched_tokens < 0 or self.state_blocks < 0:
            raise ValueError("serving model: draft_tokens, max_num_batched_tokens and state_blocks must not be "
                             "negative")
        if 0 < self.max_num_batched_tokens <= self.max_num_seqs * (1 + self.draft_tokens):
            raise ValueError(f"serving model: max_num_batched_tokens {self.max_num_batched_tokens} leaves no room "
                             f"for prefill beside {self.max_num_seqs} decodes of {1 + self.draft_tokens} tokens")

    @property
    def lookahead(self) -> int:
        """Tokens past its context a decoding request holds blocks for: k drafts computed, k slots for the drafter."""
        return 2 * self.draft_tokens

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
    """A serving model file (sim/serving_models/*.toml, sim calibrate's output), strict TOML: an unknown, missing or
    mistyped key is refused naming the file and the key (submission.strict_toml.TomlError, a ValueError)."""
    raw = strict_toml.read(path)
    missing = sorted({f.name for f in fields(ServingModel) if f.default is MISSING} - set(raw))
    if missing:
        raise strict_toml.TomlError(f"{path}: missing key(s) {', '.join(missing)}")
    return strict_toml.build(ServingModel, raw, str(path))


@dataclass(frozen=True)
class Trace:
    """A run's measured seconds per decode step, window by window: a window's seconds x its mean running requests /
    its generated tokens (every running request gains a token a step). Window i holds from its start to the next
    window's; a window with no tokens (start-up, idle, a prefill the window reports no token for) is a stall; after
    the last window the last measured rate goes on. Replayed in place of the step model, it puts the measured speed
    under the simulated scheduler and cache, so a backtest with it tells the step model's error from the rest."""

    starts: tuple[float, ...]
    step_s: tuple[float, ...]  # math.inf: a window without tokens

    def __post_init__(self) -> None:
        if not self.step_s or len(self.starts) != len(self.step_s) or self.step_s[-1] == math.inf:
            raise ValueError("trace: needs windows, one step time per start, and a last window with tokens")

    def _window(self, now: float) -> int:
        return max(bisect.bisect_right(self.starts, now) - 1, 0)

    def _end(self, index: int) -> float:
        return self.starts[index + 1] if index + 1 < len(self.starts) else math.inf

    def seconds(self, now: float, steps: float) -> float:
        """How long `steps` steps take from `now`."""
        index, t, left = self._window(now), now, float(steps)
        while True:
            rate, end = self.step_s[index], self._end(index)
            if rate < math.inf:
                if left * rate <= end - t:
                    return t + left * rate - now
                left -= (end - t) / rate
            t, index = end, index + 1

    def steps_within(self, now: float, seconds: float) -> int:
        """The most whole steps that fit in `seconds` from `now`."""
        index, t, stop, steps = self._window(now), now, now + seconds, 0.0
        while True:
            end = min(self._end(index), stop)
            if self.step_s[index] < math.inf:
                steps += (end - t) / self.step_s[index]
            if end >= stop:
                return max(int(steps), 0)
            t, index = end, index + 1


def trace_from_windows(windows: list[dict], source: str = "windows") -> Trace:
    """The trace of a run's `<log>.stats.jsonl` windows (start, seconds, tokens, running), in time order; windows
    after the last one with tokens are left out."""
    rows = sorted(windows, key=lambda w: w.get("start", math.nan))
    try:
        pairs = [(float(w["start"]), float(w["seconds"]) * float(w["running"]) / w["tokens"]
                  if w["tokens"] > 0 and w["running"] > 0 else math.inf) for w in rows]
    except (KeyError, TypeError, ZeroDivisionError) as err:
        raise ValueError(f"{source}: a window lacks start, seconds, tokens or running ({err!r})") from None
    while pairs and pairs[-1][1] == math.inf:
        pairs.pop()
    if not pairs:
        raise ValueError(f"{source}: no window with generated tokens")
    return Trace(tuple(p[0] for p in pairs), tuple(p[1] for p in pairs))


@dataclass(eq=False, slots=True)  # identity: the engine keys its running requests by job; equality is slow
class Job:
    """One request inside the simulated engine. `payload` is whatever the caller needs back at the end."""

    key: tuple
    prompt: int
    tokens: int  # tokens it will generate (thinking + answer)
    payload: object = None
    generated: int = 0  # while it runs, the engine's step count minus `base` (kept up to date when it stops)
    submitted: float = math.nan
    started: float = math.nan  # first admitted (after its prefill, or its first chunk's)
    preemptions: int = 0
    base: int = 0  # while running: the engine's step count when it had generated nothing
    admitted: int = -1  # while running: its admission number (its place in the running order)
    filled: int = 0  # while its context is prefilled in chunks: the tokens prefilled so far


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

    Every decoding request gains a token per step, so none is touched between events: the engine counts its steps,
    a running request's generated tokens are that count minus its `base`, and a heap of finishing steps gives the next
    completion. A pass over the running requests is made only when the cache could fill before it. The request being
    prefilled in chunks (at most one: it takes what is left of the token budget) is `filling`, after every running
    request in the admission order."""

    model: ServingModel
    now: float = 0.0
    trace: Trace | None = None  # measured step times in place of the step model
    waiting: list[Job] = field(default_factory=list)
    running: dict[Job, None] = field(default_factory=dict)  # in admission order: the last is preempted first
    filling: Job | None = None
    context: float = 0.0
    tokens: int = 0  # generated so far, all jobs
    prefilled: int = 0  # prompt tokens prefilled, re-prefills after preemption included
    timeline: list[Sample] = field(default_factory=list)
    preempted: list[tuple[float, tuple, int]] = field(default_factory=list)  # (time, job key, tokens it had)
    _no_admission: bool = False  # the step after a preemption admits nothing (as vLLM)
    _alone: bool = False  # the next step is scheduled on its own (vLLM may admit in it)
    _steps: int = 0  # decode steps taken
    _admissions: int = 0
    _finishing: list[tuple[int, int, Job]] = field(default_factory=list)  # heap: (step it finishes at, admitted, job)

    def __post_init__(self) -> None:
        self.now = max(self.now, self.model.startup_s)
        self._size, self._total = self.model.block_size, self.model.blocks  # read at every event
        self._ahead, self._lookahead = self.model.draft_tokens, self.model.lookahead
        self._state = self.model.state_blocks
        self._prefill_s = 0.0 if self.trace is not None else self.model.prefill_s_per_token  # a trace holds them

    def submit(self, job: Job, now: float) -> None:
        tokens = job.prompt + job.tokens + self._lookahead
        if self._blocks(tokens) + self._state > self._total:
            state = f" and {self._state} state blocks" if self._state else ""
            raise ValueError(f"request {job.key} needs {tokens} KV tokens{state}, the cache holds "
                             f"{self.model.kv_tokens} ({self._total} blocks of {self._size})")
        job.submitted = now
        self.waiting.append(job)

    def _blocks(self, tokens: int) -> int:
        return -(-tokens // self._size)

    def _used(self, later: int = 0) -> int:
        """Blocks the running requests need for their next step (or for the step `later` steps after it), their
        state blocks included."""
        size, steps = self._size, self._steps + self._lookahead + later
        return sum([(j.prompt + steps - j.base + size - 1) // size for j in self.running]) + self._states()

    def _states(self) -> int:
        """State blocks the decoding requests hold (the request being prefilled holds its own: counted with it)."""
        return len(self.running) * self._state

    def _used_bound(self, steps: int = 0) -> float:
        """An upper bound of the blocks needed `steps` steps from now, without a pass over the requests: each
        request's tokens rounded up to a whole block cost at most block_size - 1 more."""
        n, size = len(self.running), self._size
        return (self.context + n * (steps + self._lookahead + size - 1)) / size + self._states()

    def _budget(self) -> float:
        """Tokens left in a step after the decodes (vLLM schedules the running requests first)."""
        budget = self.model.max_num_batched_tokens
        return budget - len(self.running) * (1 + self._ahead) if budget else math.inf

    def _admit(self, budget: float, offset: int = 0) -> None:
        """Admit waiting requests in order while their first chunk (up to `budget` tokens) fits (the exact block count
        only when the bound is too close); `offset` corrects the running requests' count for this step."""
        self._alone = False
        if self._no_admission:
            self._no_admission = False
            # the front request (the last preempted) may fit its first chunk, or its context without drafts, again
            self._alone = (self.model.max_num_batched_tokens > 0 or self._ahead > 0) and bool(self.waiting)
            return
        keep = int(self.model.watermark * self._total)
        used = None
        while self.waiting and len(self.running) + (self.filling is not None) < self.model.max_num_seqs:
            if budget <= 0:
                self._alone = True  # the budget, not the cache, stopped it: the next step may admit
                break
            job = self.waiting[0]
            prefill = job.prompt + job.generated
            chunk = min(prefill, budget)
            need = self._blocks(chunk + self._ahead) + self._state
            free = max(need, self._blocks(prefill) + self._state) if self.model.reserve_full_isl else need
            limit = self._total - (keep if self.running or self.filling else 0)  # none for a lone request
            if used is None and self._used_bound() + offset + free > limit:
                used = self._used() + offset
            if used is not None and used + free > limit:
                break
            self.waiting.pop(0)
            if used is not None:
                used += need
            self.now += self._prefill_s * chunk
            self.prefilled += chunk
            self.context += chunk
            budget -= chunk
            if math.isnan(job.started):
                job.started = self.now
            job.admitted = self._admissions
            self._admissions += 1
            if chunk < prefill:
                job.filled, self.filling = chunk, job
            else:
                self._decode(job)  # counted as decoding from here: this step it holds no drafts
                offset += need - self._blocks(prefill + self._lookahead) - self._state
            # With drafts, an admitted request holds k slots fewer this step than a decoding one (no drafts yet):
            # this step is taken on its own, so the event solver never counts them.
            self._alone = self._alone or self._ahead > 0

    def _decode(self, job: Job) -> None:
        """A request whose context is prefilled joins the decoding requests (its first token comes this step)."""
        job.base = self._steps - job.generated
        self.running[job] = None
        heapq.heappush(self._finishing, (job.base + job.tokens, job.admitted, job))

    def _schedule_alone(self) -> None:
        """vLLM's schedule() for a step taken on its own: the decodes' blocks, the next chunk of the request being
        prefilled (preempting if either does not fit), then admissions with what is left of the budget."""
        budget, offset, job = self._budget(), 0, self.filling
        chunk = min(job.prompt + job.generated - job.filled, budget) if job is not None else 0
        need = self._blocks(job.filled + chunk + self._ahead) + self._state if job is not None else 0
        used = self._used() if self._used_bound() + need > self._total else 0  # exact only when it could matter
        if job is not None:
            if used + need > self._total:
                self._preempt()
            else:
                job.filled += chunk
                self.now += self._prefill_s * chunk
                self.prefilled += chunk
                self.context += chunk
                budget -= chunk
                if job.filled == job.prompt + job.generated:  # its last chunk: it samples its first token now
                    self.filling, job.filled = None, 0
                    self._decode(job)  # counted as decoding below; this step it holds the blocks of its chunk
                    tokens = job.prompt + job.generated
                    offset = self._blocks(tokens + self._ahead) - self._blocks(tokens + self._lookahead)
        elif used > self._total:
            self._preempt()
        self._admit(budget, offset)

    def _prefill_run(self, limit: float) -> int:
        """Take the steps in which the request being prefilled gets a whole chunk (what the decodes leave) at once,
        up to the step before its last chunk or the next completion, when the cache holds them all; the steps taken."""
        job, n = self.filling, len(self.running)
        chunk = self._budget()
        steps = (job.prompt + job.generated - job.filled - 1) // chunk
        if n:
            steps = min(steps, self._next_finish())
        if steps < 2:
            return 0
        filled = self._blocks(job.filled + steps * chunk + self._ahead) + self._state
        if self._used_bound(steps - 1) + filled > self._total and self._used(steps - 1) + filled > self._total:
            return 0  # the cache runs short on the way: one step at a time
        if self.trace is not None:
            duration = self.trace.seconds(self.now, steps)
        else:
            m = self.model
            first = self.context + chunk  # the first step's context: its chunk is in
            duration = (steps * (m.step_a + m.step_b * (n + 1) + m.step_c * first + self._prefill_s * chunk)
                        + m.step_c * (n + chunk) * steps * (steps - 1) / 2)
        if self.now + duration > limit:
            return 0
        self.timeline.append(Sample(self.now, n + 1, n * steps / duration, self._used() + filled, len(self.waiting)))
        job.filled += steps * chunk
        self.context += steps * chunk
        self.prefilled += steps * chunk
        self._generate(steps, n)
        self.now += duration
        self._no_admission = False  # a step after a preemption admits nothing: nothing could be, beside this chunk
        return steps

    def _steps_before_full(self, used: int) -> int:
        """Whole steps the running requests (holding `used` blocks for their next step) can take before one of them
        finds no free block."""
        size, steps = self._size, self._steps + self._lookahead
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

    def _step_seconds(self, n: int) -> float:
        return self.trace.seconds(self.now, 1) if self.trace is not None else self.model.step_time(n, self.context)

    def advance(self, now: float, limit: float) -> tuple[float, list[Job]]:
        """Run to the next completion (or to `limit`, the run's hard stop); return the time and the jobs that finished
        then."""
        self.now = max(self.now, now)
        while True:
            if self.filling is not None and self._prefill_run(limit):
                if self.running and self._next_finish() <= 0:
                    break
                continue
            alone = self.filling is not None or self._alone
            if alone:
                self._schedule_alone()
            elif self.waiting:
                self._admit(self._budget())
                alone = self.filling is not None or self._alone
            if not self.running and self.filling is None:
                return math.inf, []
            if alone:  # this step on its own
                n = len(self.running) + (self.filling is not None)
                per_step = self._step_seconds(n)
                if self.now + per_step > limit:
                    return math.inf, []
                self.timeline.append(Sample(self.now, n, len(self.running) / per_step,
                                            math.ceil(self.context / self._size) + self._states(),
                                            len(self.waiting)))
                self._generate(1, len(self.running))
                self.now += per_step
                if self.running and self._next_finish() <= 0:
                    break
                continue
            n = len(self.running)
            to_finish = self._next_finish()
            if self._used_bound(to_finish - 1) <= self._total:  # room to the next completion: no pass needed
                steps, used = to_finish, math.ceil(self.context / self._size) + self._states()
            else:
                used = self._used()
                if used > self._total:  # a step taken alone left this one short (a first token, drafts from now)
                    self._preempt()
                    continue
                steps = min(to_finish, self._steps_before_full(used))
            if self.trace is not None:
                per_step = self.trace.seconds(self.now, 1)
                duration = self.trace.seconds(self.now, steps)
            else:
                per_step = self.model.step_time(n, self.context)
                duration = steps * per_step + self.model.step_c * n * steps * (steps - 1) / 2
            self.timeline.append(Sample(self.now, n, n / per_step, used, len(self.waiting)))
            if self.now + duration > limit:  # stop at the limit: advance whole steps only
                if self.trace is not None:
                    steps = min(self.trace.steps_within(self.now, limit - self.now), steps)
                    self._generate(steps, n)
                    self.now += self.trace.seconds(self.now, steps)
                    return math.inf, []
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

    def _requeue(self, job: Job) -> None:
        job.preemptions += 1
        self.preempted.append((self.now, job.key, job.generated))
        self.waiting.insert(0, job)

    def _preempt(self) -> None:
        """The next step does not fit: preempt the request being prefilled, then the newest running requests, until
        it does (vLLM's recompute)."""
        job = self.filling
        if job is not None:
            self.context -= job.filled
            self.filling, job.filled, job.admitted = None, 0, -1
            self._requeue(job)
        used = self._used()
        while used > self._total:
            job = next(reversed(self.running))
            self._stop(job)
            used -= self._blocks(job.prompt + job.generated + self._lookahead) + self._state
            self._requeue(job)
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
        if self.filling is not None:
            running.append(self.filling)
            self.filling.filled, self.filling.admitted, self.filling = 0, -1, None
        jobs = running + self.waiting
        self.waiting, self.context, self._finishing = [], 0.0, []
        return jobs
