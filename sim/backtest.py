"""Backtest: replay a real run's own log under its own profile and serving model, and compare with what happened.

Every request draws the logged attempt with the same input and attempt number (rule 1 of sim.pool), so only the
clock is simulated; the per-attempt start and finish errors, the attempt counts (finished, and aborted at the hard
stop) and the score difference say whether the serving model matches the hardware the log came from. With the run's
measured trace (`--trace`: its engine statistics' seconds per step, window by window) in place of the step model, the
same comparison separates the step model's error from the scheduler's and the cache model's.
"""

from __future__ import annotations

import random
import statistics
from dataclasses import dataclass

from sim.pool import AttemptPool
from sim.run import simulate
from sim.serving import ServingModel, SharedEngine, Trace
from submission.attempts import AttemptRecord
from submission.schedule import InputInfo, ScheduleConfig
from submission.selection import Candidates


@dataclass(frozen=True)
class Backtest:
    matched: int
    start_error_s: float  # mean |simulated - logged| start
    finish_error_s: float
    logged_score: float
    simulated_score: float
    logged_attempts: int  # attempts in the log that are not hard-stop aborts
    simulated_attempts: int
    logged_aborted: int  # attempts the run's hard stop aborted (finish "aborted")
    simulated_aborted: int


def backtest(records: list[AttemptRecord], inputs: list[InputInfo], truth: dict, config: ScheduleConfig,
             serving: ServingModel, trace: Trace | None = None, transfer: bool = True) -> Backtest:
    """`trace`: the run's measured step times in place of the serving model's step model (its cache model stays)."""
    pool = AttemptPool(records, truth)
    result = simulate(config, inputs, pool.draw, SharedEngine(serving, trace=trace), truth, random.Random(0), transfer)
    logged = {(r.task_id, r.test_index, r.attempt): r for r in records}
    starts, finishes = [], []
    for request, _, submitted, finished in result.finished:
        record = logged.get(request.key + (request.attempt,))
        if record is not None:
            # the solver submits nothing before its engine is up; the simulator queues from 0 and starts at startup_s
            starts.append(abs(max(submitted, serving.startup_s) - record.started_s))
            finishes.append(abs(finished - record.finished_s))
    candidates = Candidates(transfer=transfer)
    for r in records:
        candidates.add_record(r)
    tasks: dict[str, list[bool]] = {}
    for info in inputs:
        tasks.setdefault(info.task_id, []).append(truth[info.key] in candidates.answers(info.key))
    logged_score = 100 * statistics.fmean(sum(v) / len(v) for v in tasks.values())
    aborted = sum(r.finish == "aborted" for r in records)
    return Backtest(len(starts), statistics.fmean(starts) if starts else float("nan"),
                    statistics.fmean(finishes) if finishes else float("nan"), logged_score, result.score,
                    len(records) - aborted, len(result.finished), aborted, len(result.aborted))
