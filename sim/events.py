"""A discrete-event run of the solver's scheduler on a simulated clock.

The same `Scheduler` as the solver; only the engine (a `serve` function giving each request its duration and record)
and the clock differ. Used by the scheduler's deadline tests now and by the forecasts of `sim/` (issue 4).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Callable

from submission.attempts import AttemptRecord
from submission.schedule import Request, Scheduler

# serve(request, now) -> (seconds the request takes, its record if it runs to the end)
Serve = Callable[[Request, float], tuple[float, AttemptRecord]]


@dataclass
class SimRun:
    finished: list[AttemptRecord] = field(default_factory=list)
    aborted: list[Request] = field(default_factory=list)
    started: list[tuple[float, Request]] = field(default_factory=list)
    end_s: float = 0.0


def simulate(scheduler: Scheduler, serve: Serve) -> SimRun:
    """Run until the scheduler has nothing left or the hard stop, where whatever is in flight is aborted."""
    run = SimRun()
    events: list[tuple[float, int, AttemptRecord]] = []
    now, counter = 0.0, 0
    hard_stop = scheduler.config.hard_stop
    while True:
        while (request := scheduler.next(now)) is not None:
            duration, record = serve(request, now)
            run.started.append((now, request))
            heapq.heappush(events, (now + duration, counter, record))
            counter += 1
        if not events:
            break
        when, _, record = heapq.heappop(events)
        if when > hard_stop:
            now = hard_stop
            run.aborted = scheduler.abort_all()
            break
        now = when
        scheduler.on_finished(now, record.outcome())
        run.finished.append(record)
    run.end_s = now
    return run
