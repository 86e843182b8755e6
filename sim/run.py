"""One simulated run: the solver's own scheduler and selection on a simulated clock and engine.

The scheduler (submission.schedule) and answer selection (submission.selection) are the solver's code, not copies;
only the engine and the clock are simulated. The engine is either the serving model (sim.serving.SharedEngine) or, for
tests, `LatencyEngine`, where each request takes its own fixed time. As in the solver, a request's cap is fixed when
the scheduler hands it to the engine; it may then wait inside the engine (the cache decides), and that wait is kept.

Common random numbers: each slot (test input, attempt number, level, repair turn) draws its attempt from its own
random stream, seeded from the run seed and the slot key, so two runs with the same seed (a base and a +1% variant)
draw the same attempt for the same slot whatever order or time the requests start in.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Protocol

from sim import agent
from sim.pool import SimAttempt
from sim.serving import Job
from submission.schedule import InputInfo, Request, ScheduleConfig, Scheduler
from submission.selection import Candidates


class SimEngine(Protocol):
    tokens: int
    preempted: list

    def submit(self, job: Job, now: float) -> None: ...

    def advance(self, now: float, limit: float) -> tuple[float, list[Job]]: ...

    def abort_all(self) -> list[Job]: ...


@dataclass
class LatencyEngine:
    """Every request takes its own time, `duration(job)`, with no shared capacity (the scheduler's tests)."""

    duration: Callable[[Job], float]
    pending: list[tuple[float, int, Job]] = field(default_factory=list)
    tokens: int = 0
    timeline: list = field(default_factory=list)
    preempted: list = field(default_factory=list)  # never: no shared cache

    def submit(self, job: Job, now: float) -> None:
        job.submitted = job.started = now
        self.pending.append((now + self.duration(job), len(self.pending), job))

    def advance(self, now: float, limit: float) -> tuple[float, list[Job]]:
        if not self.pending:
            return math.inf, []
        when = min(p[0] for p in self.pending)
        if when > limit:
            return math.inf, []
        done = [p for p in self.pending if p[0] == when]
        self.pending = [p for p in self.pending if p[0] != when]
        for _, _, job in done:
            job.generated = job.tokens
            self.tokens += job.tokens
        return when, [job for _, _, job in done]

    def abort_all(self) -> list[Job]:
        jobs = [job for _, _, job in self.pending]
        self.pending = []
        return jobs


@dataclass
class SimResult:
    finished: list[tuple[Request, SimAttempt, float, float]]  # request, attempt, submitted, finished
    aborted: list[tuple[Request, int]]  # request, tokens it had generated
    started: list[tuple[float, Request]]  # every request handed to the engine, with the time
    end_s: float
    hard_stop_s: float
    task_scores: dict[str, float]
    unanswered: int
    tokens_generated: int
    skipped: int  # queued attempts dropped because their cap fell below min_cap
    never_started: int  # attempts still queued at the stop (too late for their level, or no time left)
    answered_curve: list[tuple[float, int]]
    engine_waits: list[float]  # per started request, seconds from submission to its first admission
    preemptions: int

    @property
    def score(self) -> float:
        return 100 * sum(self.task_scores.values()) / len(self.task_scores)

    def by_level(self) -> Counter:
        return Counter(r.level.name for r, _, _, _ in self.finished)

    def tokens_by_outcome(self, truth: dict) -> Counter:
        out: Counter = Counter()
        for request, attempt, _, _ in self.finished:
            kind = ("natural right" if attempt.grid == truth[request.key] else "natural wrong") if attempt.natural \
                else "forced"
            out[kind] += attempt.tokens
        return out


class SlotStream:
    """The random stream of one slot of one run (see the module doc): a random.Random, seeded when first drawn from.
    Most draws take no random number (an input's own attempt of the same number, not cut), and seeding was most of a
    draw's cost."""

    __slots__ = ("seed", "_rng")

    def __init__(self, seed: int):
        self.seed, self._rng = seed, None

    def _stream(self) -> random.Random:
        if self._rng is None:
            self._rng = random.Random(self.seed)
        return self._rng

    def choice(self, items):  # what sim.pool draws with, without __getattr__'s detour
        return self._stream().choice(items)

    def random(self) -> float:
        return self._stream().random()

    def __getattr__(self, name: str):  # uniform, randint, ...: the seeded stream's
        return getattr(self._stream(), name)


def slot_rng(seed: int, request: Request) -> SlotStream:
    # request.seed is the scheduler's stable hash of (task, test input, attempt): no second hash per request.
    return SlotStream((((seed << 32 | request.seed) << 4 | int(request.level)) << 8) | request.repair_turn)


def simulate(config: ScheduleConfig, inputs: list[InputInfo], draw: Callable[[Request, SlotStream], SimAttempt],
             engine: SimEngine, truth: dict[tuple[str, int], object], seed: int | random.Random,
             transfer: bool = True) -> SimResult:
    """Run the schedule until nothing is left or the hard stop; score the selected answers against `truth`.
    `seed` is the run seed (a random.Random gives one); `transfer`: the profile's selection.transfer."""
    if isinstance(seed, random.Random):
        seed = seed.getrandbits(32)
    scheduler = Scheduler(config, inputs)
    task_inputs = {i.task_id: i.task_inputs for i in inputs}
    prompts = {i.key: i.prompt_tokens for i in inputs}
    candidates = Candidates(transfer=transfer)
    finished: list[tuple[Request, SimAttempt, float, float]] = []
    answered_curve: list[tuple[float, int]] = []
    started: list[tuple[float, Request]] = []
    waits: list[float] = []
    now, hard_stop = 0.0, config.hard_stop
    while True:
        while (request := scheduler.next(now)) is not None:
            attempt = draw(request, slot_rng(seed, request))
            job = Job(request.key + (request.attempt,), attempt.prompt or prompts[request.key], attempt.tokens,
                      (request, attempt, now))
            engine.submit(agent.first_turn(job, attempt.turns), now)  # a tool agent's turns: one job each
            started.append((now, request))
        when, done = engine.advance(now, hard_stop)
        if when == math.inf:
            break
        now = when
        for job in done:
            if (later := agent.next_turn(job, job.payload[1].turns, job.payload[1].tool_turn)) is not None:
                engine.submit(later, now)
                continue
            waits.append(job.started - job.submitted)
            request, attempt, submitted = job.payload
            scheduler.on_finished(now, attempt.outcome(request))
            finished.append((request, attempt, submitted, now))
            candidates.add(request.task_id, request.test_index, request.attempt, attempt.grid,
                           tuple(p[:task_inputs[request.task_id]] for p in attempt.program_candidates),
                           attempt.weak_outputs)
        answered_curve.append((now, len(candidates.by_input)))
    left = engine.abort_all()
    # A request still waiting in the engine at the end was kept out by the cache until the hard stop.
    waits += [(hard_stop if math.isnan(job.started) else job.started) - job.submitted for job in left]
    aborted = [(job.payload[0], job.generated) for job in left]
    never_started = scheduler.pending()
    scheduler.abort_all()
    scores: dict[str, list[bool]] = {}
    for info in inputs:
        pair = candidates.answers(info.key)
        scores.setdefault(info.task_id, []).append(truth[info.key] in pair)
    return SimResult(finished, aborted, started, min(now, hard_stop) if finished else 0.0, hard_stop,
                     {t: sum(v) / len(v) for t, v in scores.items()},
                     sum(1 for i in inputs if i.key not in candidates.by_input), engine.tokens, len(scheduler.skipped),
                     never_started, answered_curve, waits, len(engine.preempted))


