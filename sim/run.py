"""One simulated run: the solver's own scheduler and selection on a simulated clock and engine.

The scheduler (submission.schedule) and answer selection (submission.selection) are the solver's code, not copies;
only the engine and the clock are simulated. The engine is either the serving model (sim.serving.SharedEngine) or, for
tests, `LatencyEngine`, where each request takes its own fixed time.
"""

from __future__ import annotations

import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Protocol

from sim.pool import SimAttempt
from sim.serving import Job
from submission.schedule import InputInfo, Request, ScheduleConfig, Scheduler
from submission.solve import Candidates


class SimEngine(Protocol):
    tokens: int

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

    def submit(self, job: Job, now: float) -> None:
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
    skipped: int
    answered_curve: list[tuple[float, int]]

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


def simulate(config: ScheduleConfig, inputs: list[InputInfo], draw: Callable[[Request, random.Random], SimAttempt],
             engine: SimEngine, truth: dict[tuple[str, int], object], rng: random.Random,
             answer_reserve: int = 4000) -> SimResult:
    """Run the schedule until nothing is left or the hard stop; score the selected answers against `truth`."""
    scheduler = Scheduler(config, inputs)
    task_inputs = {i.task_id: i.task_inputs for i in inputs}
    prompts = {i.key: i.prompt_tokens for i in inputs}
    candidates = Candidates()
    finished: list[tuple[Request, SimAttempt, float, float]] = []
    answered_curve: list[tuple[float, int]] = []
    started: list[tuple[float, Request]] = []
    now, hard_stop = 0.0, config.hard_stop
    while True:
        while (request := scheduler.next(now)) is not None:
            attempt = draw(request, rng)
            prompt = attempt.prompt or prompts[request.key]
            job = Job(request.key + (request.attempt,), prompt, attempt.tokens,
                      prompt + request.cap + answer_reserve, (request, attempt, now))
            engine.submit(job, now)
            started.append((now, request))
        when, done = engine.advance(now, hard_stop)
        if when == math.inf:
            break
        now = when
        for job in done:
            request, attempt, submitted = job.payload
            scheduler.on_finished(now, attempt.outcome(request))
            finished.append((request, attempt, submitted, now))
            candidates.add(request.task_id, request.test_index, request.attempt, attempt.grid,
                           attempt.train_perfect, attempt.program_outputs[:task_inputs[request.task_id]])
        answered_curve.append((now, len(candidates.by_input)))
    aborted = [(job.payload[0], job.generated) for job in engine.abort_all()]
    scheduler.abort_all()
    scores: dict[str, list[bool]] = {}
    for info in inputs:
        pair = candidates.answers(info.key)
        scores.setdefault(info.task_id, []).append(truth[info.key] in pair)
    return SimResult(finished, aborted, started, min(now, hard_stop) if finished else 0.0, hard_stop,
                     {t: sum(v) / len(v) for t, v in scores.items()},
                     sum(1 for i in inputs if i.key not in candidates.by_input), engine.tokens, len(scheduler.skipped),
                     answered_curve)


