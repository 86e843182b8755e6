"""Solver paths a random model never reaches: engine restart, the repair turn, transferred programs, stats files."""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json

import pytest

from submission.attempts import AttemptRecord, read_log
from submission.reasoning.profile import EngineConfig, Profile, PromptConfig
from submission.reasoning.engines import make_engine
from submission.reasoning.engines.base import EngineDead, ThroughputMeter
from submission.reasoning.engines.replay import ReplayEngine
from submission.reasoning.run import Run
from submission.sandbox.client import Sandbox
from submission.schedule import Level, Request, ScheduleConfig
from submission.selection import Candidates, Source
from submission.reasoning.solve import Attempts
from submission.tasks import load_tasks

SCHEDULE = ScheduleConfig(time_limit_s=120, hard_stop_margin_s=5, stop_new_margin_s=10, rate_tok_s=1000,
                          cap_margin_s=1, cap_margin_tokens=10, min_cap=100, cap_first_single=4000,
                          cap_first_multi=3000, cap_second=2000, repair_caps=(1500, 1000), cap_extra=1000,
                          repair_min_left_s=1, extra_min_left_s=1, max_in_flight=2)


@pytest.fixture(scope="module")
def tasks(arc_data):
    return load_tasks(arc_data / "arc-agi-2" / "training", arc_data / "arc-agi-2" / "training")


def record(task, attempt=1, level=Level.FIRST, grid=None, program=None, seconds=0.05) -> AttemptRecord:
    return AttemptRecord(task.id, 0, attempt, level, 0, 4000, natural=True, thinking_tokens=300, answer_tokens=40,
                         grid=grid, program=program, started_s=0.0, finished_s=seconds)


class DeadEngine:
    """An engine whose every request fails, as a crashed vLLM does (EngineDeadError)."""

    def __init__(self):
        self.meter = ThroughputMeter()

    async def start(self):
        return None

    async def generate(self, request):
        raise EngineDead("EngineCore encountered an issue")

    async def abort(self, request_id):
        return None

    async def close(self):
        return None


def test_a_dead_engine_is_restarted_once_and_its_attempts_rerun(tasks, tmp_path):
    chosen = [t for t in tasks.tasks if len(t.test_inputs) == 1][:4]
    subset = type(tasks)(tuple(chosen), ())
    logged = [record(t, a, Level(a - 1), grid=t.test_outputs[0]) for t in chosen for a in (1, 2, 3)]
    made = []

    def dies_once(profile):
        made.append(DeadEngine() if not made else ReplayEngine(logged, profile.engine, 0.0))
        return made[-1]

    profile = Profile(engine=EngineConfig(kind="replay", model="unused"), schedule=SCHEDULE)
    args = argparse.Namespace(out=tmp_path / "submission.json", log=tmp_path / "run.jsonl", resume=False)
    run = Run(args, profile, subset, dies_once)
    asyncio.run(run.go())
    assert len(made) == 2
    assert run.stats["engine restarts"] == 1
    assert not [r for r in run.finished if r.finish.startswith("error")]  # requeued, not spent
    assert {(r.task_id, r.level) for r in run.finished} >= {(t.id, Level.FIRST) for t in chosen}
    submission = json.loads(args.out.read_text())
    assert all(submission[t.id][0]["attempt_1"] == [list(r) for r in t.test_outputs[0]] for t in chosen)


def test_repair_turn_shows_the_best_programs_differences(tasks):
    task = next(t for t in tasks.tasks if t.id == "25ff71a9")  # shift down by one row
    half_right = ("def transform(grid):\n    if grid[0] == [0] * len(grid[0]):\n        return grid\n"
                  "    return [[0] * len(grid[0])] + grid[:-1]\n")
    prompts = []
    engine = ReplayEngine([record(task, grid=((1,),), program=half_right)], EngineConfig(kind="replay"), 0.0)
    with Sandbox() as box:
        attempts = Attempts(Profile(), {task.id: task}, engine, box,
                            lambda t, i, view, extra: prompts.append(extra) or [0] * 10, lambda: 0.0)
        first = asyncio.run(attempts.run(Request(task.id, 0, 1, Level.FIRST, 4000, 1)))
        assert 1 <= first.demos_right < len(task.train) and not first.train_perfect
        asyncio.run(attempts.run(Request(task.id, 0, 2, Level.REPAIR, 1500, 2, repair_turn=1)))
    assert prompts[0] == "" and "A previous attempt wrote this program:" in prompts[1]
    assert "cells differ (row, column)" in prompts[1] and "correct." in prompts[1]


def test_the_repair_turn_starts_from_a_plain_view_program(tasks):
    """The repair turn is queued for a plain-view program (Algorithm 5 L2, study ~2491) and shows that program: not the
    second attempt's (reordered demonstrations), even when it reproduces more demonstrations."""
    task = next(t for t in tasks.tasks if t.id == "25ff71a9")
    half_right = ("def transform(grid):\n    if grid[0] == [0] * len(grid[0]):\n        return grid\n"
                  "    return [[0] * len(grid[0])] + grid[:-1]\n")
    reordered = "def transform(grid):\n    return [[0] * len(grid[0])] + grid[:-1]  # the second attempt's\n"
    prompts = []
    engine = ReplayEngine([record(task, grid=((1,),), program=half_right)], EngineConfig(kind="replay"), 0.0)
    with Sandbox() as box:
        attempts = Attempts(Profile(), {task.id: task}, engine, box,
                            lambda t, i, view, extra: prompts.append(extra) or [0] * 10, lambda: 0.0)
        attempts.note_program(dataclasses.replace(record(task, 2, Level.SECOND, program=reordered),
                                                  demos_right=len(task.train)))
        asyncio.run(attempts.run(Request(task.id, 0, 1, Level.FIRST, 4000, 1)))
        asyncio.run(attempts.run(Request(task.id, 0, 3, Level.REPAIR, 1500, 2, repair_turn=1)))
    assert half_right.rstrip() in prompts[1] and "the second attempt's" not in prompts[1]


def test_train_perfect_programs_transfer_to_other_test_inputs(tasks):
    task = next(t for t in tasks.tasks if t.id == "25ff71a9")
    assert len(task.test_inputs) == 2
    program = "def transform(grid):\n    return [[0] * len(grid[0])] + grid[:-1]\n"
    engine = ReplayEngine([record(task, grid=((1,),), program=program)], EngineConfig(kind="replay"), 0.0)
    with Sandbox() as box:
        attempts = Attempts(Profile(), {task.id: task}, engine, box, lambda *a: [0], lambda: 0.0)
        done = asyncio.run(attempts.run(Request(task.id, 0, 1, Level.FIRST, 4000, 1)))
    candidates = Candidates()
    assert candidates.add_record(done) == [(task.id, 0), (task.id, 1)]
    assert candidates.by_input[(task.id, 1)][0].source is Source.TRANSFERRED
    assert candidates.answers((task.id, 1))[0] == task.test_outputs[1]  # the transferred output answers input 1
    assert candidates.answers((task.id, 0))[0] == task.test_outputs[0]  # the program beats the wrong grid


def test_replay_meter_windows_reach_the_stats_file(tasks, tmp_path):
    chosen = [t for t in tasks.tasks if len(t.test_inputs) == 1][:3]
    subset = type(tasks)(tuple(chosen), ())
    logged = [record(t, a, Level(a - 1), grid=((a,),), seconds=0.4) for t in chosen for a in (1, 2, 3)]
    log = tmp_path / "earlier.jsonl"
    log.write_text("".join(json.dumps(r.to_json()) + "\n" for r in logged))
    profile = Profile(engine=EngineConfig(kind="replay", model=str(log), stats_window_s=0.2), schedule=SCHEDULE,
                      prompt=PromptConfig())
    args = argparse.Namespace(out=tmp_path / "submission.json", log=tmp_path / "run.jsonl", resume=False)
    run = Run(args, profile, subset, make_engine)
    asyncio.run(run.go())
    rows = [json.loads(line) for line in (tmp_path / "run.stats.jsonl").read_text().splitlines()]
    assert rows and {"start", "seconds", "tokens", "running"} <= set(rows[0])
    assert sum(r["tokens"] for r in rows) > 0 and max(r["running"] for r in rows) > 0
    # every generated token, the last attempt's too: the window in progress at the end is written as a shorter one
    assert sum(r["tokens"] for r in rows) == sum(r.tokens for r in read_log(tmp_path / "run.jsonl"))


def test_the_meter_ends_its_window_in_progress_as_a_shorter_one():
    meter = ThroughputMeter(window_s=2.0, _start=100.0, _last=100.0)
    meter.add(tokens=5, running=2, prompt_tokens=7, context=10.0, now=100.5)
    meter.add(tokens=3, running=1, context=4.0, now=101.0)
    meter.close(now=103.0)  # one whole window (100-102, 8 tokens), then 102-103 with none
    assert [(w.start, w.seconds, w.tokens, w.prompt_tokens) for w in meter.windows] == [(100.0, 2.0, 8, 7),
                                                                                         (102.0, 1.0, 0, 0)]
    assert meter.windows[0].running == (2 * 0.5 + 1 * 1.0) / 2.0 and meter.windows[1].running == 1.0
    assert meter.windows[0].context == (10.0 * 0.5 + 4.0 * 1.0) / 2.0 and meter.windows[1].context == 4.0
    meter.add(tokens=4, running=0, now=103.5)
    meter.close(now=103.5)
    assert (meter.windows[-1].start, meter.windows[-1].seconds, meter.windows[-1].tokens) == (103.0, 0.5, 4)
    meter.close(now=103.5)  # nothing since: no empty window
    assert len(meter.windows) == 3
