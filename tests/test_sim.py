"""The simulator: conservation of tokens, deadlines under the serving model, saturation, calibration, backtest."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from sim.backtest import backtest
from sim.calibrate import fit
from sim.example_log import make_records
from sim.forecast import build_inputs, forecast, one_run
from sim.pool import AttemptPool
from sim.serving import ServingModel
from submission.attempts import AttemptRecord
from submission.config import load_profile
from submission.schedule import Level, Request
from submission.tasks import load_tasks

REPO = Path(__file__).resolve().parents[1]
MOE = ServingModel(0.03, 0.0008, 3e-8, 5e-5, 420.0, 4_000_000, 56)


@pytest.fixture(scope="module")
def world(arc_data):
    tasks = load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks
    records = make_records(tasks, seed=1)
    inputs, truth = build_inputs(tasks, {}, 240, random.Random(0))
    return tasks, records, inputs, truth, AttemptPool(records, truth)


def test_tokens_are_conserved(world):
    _, _, inputs, truth, pool = world
    schedule = load_profile("moe-4xL4-direct").schedule  # 96K direct first attempts: the 12 hours saturate
    result, engine = one_run(schedule, inputs, truth, pool, MOE, seed=3)
    finished = sum(a.tokens for _, a, _, _ in result.finished)
    partial = sum(generated for _, generated in result.aborted)
    assert result.tokens_generated == finished + partial == engine.tokens
    assert result.aborted  # the example saturates the 12 hours: the hard stop cuts some attempts


def test_no_request_after_the_stop_margin_and_nothing_runs_past_the_hard_stop(world):
    _, _, inputs, truth, pool = world
    for name in ("moe-4xL4", "dense-27b-4xL4"):
        schedule = load_profile(name).schedule
        for seed in range(5):
            result, _ = one_run(schedule, inputs, truth, pool, MOE, seed=seed, throughput=random.Random(seed).uniform(0.5, 2))
            assert all(start <= schedule.stop_new for start, _ in result.started)
            assert all(end <= schedule.hard_stop for _, _, _, end in result.finished)


def test_unlimited_throughput_gives_every_input_both_attempts(world):
    _, _, inputs, truth, pool = world
    schedule = load_profile("moe-4xL4").schedule
    fast = ServingModel(1e-6, 0.0, 0.0, 0.0, 0.0, 10**12, 10**6)
    result, _ = one_run(schedule, inputs, truth, pool, fast, seed=0)
    levels: dict = {}
    for request, _, _, _ in result.finished:
        levels.setdefault(request.key, set()).add(request.level)
    assert len(levels) == len(inputs) and all({Level.FIRST, Level.SECOND} <= v for v in levels.values())
    assert result.unanswered == 0 and not result.aborted


def test_more_throughput_never_hurts_much_and_forecasts_are_reproducible(world):
    _, _, inputs, truth, pool = world
    schedule = load_profile("moe-4xL4").schedule
    a = forecast(schedule, inputs, truth, pool, MOE, runs=6, seed=5)
    b = forecast(schedule, inputs, truth, pool, MOE, runs=6, seed=5)
    assert a.score == b.score and a.runs_interval == b.runs_interval
    assert a.runs_interval[0] <= a.score <= a.runs_interval[1]
    fast = forecast(schedule, inputs, truth, pool, MOE.scaled(throughput=3.0), runs=6, seed=5)
    assert fast.score > a.score and fast.mean(lambda r: r.unanswered) < a.mean(lambda r: r.unanswered)


def test_truncation_turns_long_thinking_into_forced_attempts(world):
    tasks, records, _, truth, pool = world
    long = next(r for r in records if r.natural and r.thinking_tokens > 30_000)
    cut = pool.draw(Request(long.task_id, long.test_index, long.attempt, long.level, 10_000, 0), random.Random(0))
    assert cut.thinking == 10_000 and not cut.natural and not cut.train_perfect and cut.source.endswith("+cut")
    made_up = pool.draw(Request("made-up-0000", 0, 1, Level.FIRST, 200_000, 0), random.Random(0))
    assert made_up.source == "pool" and made_up.grid in (None, truth[("made-up-0000", 0)]) or made_up.grid[0][0] == "wrong"


def test_calibration_recovers_a_known_serving_model():
    true = ServingModel(0.02, 0.001, 4e-8, 6e-5, 300.0, 10**6, 64)
    rng = random.Random(0)
    windows = []
    for w in range(200):
        n = rng.randint(1, 60)
        context = n * rng.uniform(2_000, 60_000)
        prompt = rng.choice([0, 0, rng.randint(1_000, 20_000)])
        seconds = 10.0
        per_step = true.step_time(n, context)
        steps = (seconds - true.prefill_s_per_token * prompt) / per_step
        windows.append({"start": 300.0 + 10 * w, "seconds": seconds, "tokens": int(steps * n), "running": n,
                        "prompt_tokens": prompt, "context": context})
    result = fit(windows, 10**6, 64)
    assert result.token_error < 0.01
    assert result.model.step_a == pytest.approx(0.02, rel=0.05)
    assert result.model.step_c == pytest.approx(4e-8, rel=0.05)
    assert result.model.startup_s == 300.0


def test_backtest_of_a_simulated_run_matches_itself(world):
    _, _, inputs, truth, pool = world
    real_inputs = [i for i in inputs if not i.task_id.startswith("made-up")][:60]
    schedule = replace(load_profile("moe-4xL4").schedule, max_in_flight=20)
    serving = replace(MOE, startup_s=0.0, prefill_s_per_token=0.0)
    run = one_run(schedule, real_inputs, truth, pool, serving, seed=0)[0]
    assert not run.aborted  # a run that ends on its own, so its log is complete
    logged = [AttemptRecord(r.task_id, r.test_index, r.attempt, r.level, r.seed, r.cap, natural=a.natural,
                            thinking_tokens=a.thinking, answer_tokens=a.answer, prompt_tokens=a.prompt, grid=a.grid,
                            train_perfect=a.train_perfect, demos_right=a.demos_right,
                            program_outputs=a.program_outputs, started_s=start, finished_s=end)
              for r, a, start, end in run.finished]
    result = backtest(logged, real_inputs, truth, schedule, serving)
    assert result.matched == len(logged)
    assert result.start_error_s < 1e-6 and result.finish_error_s < 1e-6
    assert result.simulated_score == pytest.approx(result.logged_score)
    slower = backtest(logged, real_inputs, truth, schedule, serving.scaled(throughput=0.8))
    assert slower.finish_error_s > 60  # a wrong serving model shows


def test_make_simulate_command(arc_data, tmp_path):
    out = subprocess.run([sys.executable, "-m", "sim", "forecast", "--log", str(REPO / "sim/data/example_attempts.jsonl"),
                          "--tasks", str(arc_data / "arc-agi-2" / "evaluation"), "--profile", "moe-4xL4",
                          "--runs", "4", "--sweep", "dense-27b-4xL4", "--out", str(tmp_path)],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "task-weighted score" in out.stdout and "dense-27b-4xL4" in (tmp_path / "sweep.txt").read_text()
    assert (tmp_path / "timeline.png").read_bytes()[:4] == b"\x89PNG"


def test_example_log_is_what_its_generator_makes(arc_data):
    tasks = load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks
    shipped = (REPO / "sim/data/example_attempts.jsonl").read_text().splitlines()
    assert [json.loads(line) for line in shipped] == [r.to_json() for r in make_records(tasks, seed=0)]
