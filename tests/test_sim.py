"""The simulator: conservation of tokens, deadlines under the serving model, saturation, calibration, backtest, common
random numbers and sensitivities, the scenario interface and its JSON report."""

from __future__ import annotations

import json
import random
import statistics
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from sim.backtest import backtest
from sim.calibrate import fit
from sim.example_log import LogShape, make_records, parse_bins
from sim.example_log import main as main_example_log
from sim.forecast import build_inputs, forecast, one_run, sensitivity
from sim.pool import AttemptPool
from sim.run import LatencyEngine, simulate
from sim.scenario import make_scenario, parse_counts, resolve
from sim.serving import Job, ServingModel, SharedEngine, Trace, trace_from_windows
from submission.attempts import AttemptRecord
from submission.profiles import load_profile
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
    # Streams at half the speed the cap formula assumes: the hard stop cuts some attempts.
    result, engine = one_run(schedule, inputs, truth, pool, MOE, seed=3, throughput=0.5)
    finished = sum(a.tokens for _, a, _, _ in result.finished)
    partial = sum(generated for _, generated in result.aborted)
    assert result.tokens_generated == finished + partial == engine.tokens
    assert result.aborted


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
    slow = MOE.scaled(throughput=0.5)  # an engine that leaves inputs unanswered
    a = forecast(schedule, inputs, truth, pool, slow, runs=6, seed=5)
    b = forecast(schedule, inputs, truth, pool, slow, runs=6, seed=5)
    assert a.score == b.score and a.runs_interval == b.runs_interval
    assert a.runs_interval[0] <= a.score <= a.runs_interval[1]
    fast = forecast(schedule, inputs, truth, pool, slow.scaled(throughput=3.0), runs=6, seed=5)
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
    assert result.logged_attempts == result.simulated_attempts == len(logged) and result.simulated_aborted == 0
    slower = backtest(logged, real_inputs, truth, schedule, serving.scaled(throughput=0.8))
    assert slower.finish_error_s > 60  # a wrong serving model shows


def test_a_measured_trace_replays_window_by_window():
    """Seconds per step = a window's seconds x running / tokens; a window without tokens is a stall; after the last
    window its rate goes on."""
    windows = [{"start": 0.0, "seconds": 10.0, "tokens": 40, "running": 4},  # 1 s a step
               {"start": 10.0, "seconds": 10.0, "tokens": 0, "running": 4},  # a stall
               {"start": 20.0, "seconds": 10.0, "tokens": 80, "running": 4},  # 0.5 s a step
               {"start": 30.0, "seconds": 5.0, "tokens": 0, "running": 0}]  # idle at the end: left out
    trace = trace_from_windows(windows)
    assert trace == Trace((0.0, 10.0, 20.0), (1.0, float("inf"), 0.5))
    assert trace.seconds(0.0, 15) == 10 + 10 + 5 * 0.5
    assert trace.seconds(5.0, 5) == 5.0 and trace.seconds(40.0, 4) == 2.0  # the last rate goes on
    assert trace.steps_within(0.0, 22.5) == 15 and trace.steps_within(12.0, 8.0) == 0
    with pytest.raises(ValueError, match="stats.jsonl: no window with generated tokens"):
        trace_from_windows(windows[1:2], "stats.jsonl")
    with pytest.raises(ValueError, match="stats.jsonl: a window lacks"):
        trace_from_windows([{"start": 0.0, "tokens": 3}], "stats.jsonl")
    # In the engine: the trace's step times, not the model's (and no prefill cost: the windows hold it).
    model = ServingModel(9.0, 9.0, 9.0, 9.0, 0.0, 10_000, 8, 16)
    engine = SharedEngine(model, trace=trace)
    for index in range(4):
        engine.submit(Job((index,), 100, 15), 0.0)
    now, done = engine.advance(0.0, float("inf"))
    assert now == 22.5 and len(done) == 4 and engine.prefilled == 400


def test_backtest_on_the_runs_own_trace(world):
    """A run whose step time is constant (no b, c or prefill) is its own trace: replayed on it, the backtest matches;
    on a trace 20% slower it does not."""
    _, _, inputs, truth, pool = world
    real_inputs = [i for i in inputs if not i.task_id.startswith("made-up")][:40]
    schedule = replace(load_profile("moe-4xL4").schedule, max_in_flight=20)
    serving = ServingModel(0.05, 0.0, 0.0, 0.0, 0.0, 4_000_000, 56)
    run = one_run(schedule, real_inputs, truth, pool, serving, seed=0)[0]
    logged = [AttemptRecord(r.task_id, r.test_index, r.attempt, r.level, r.seed, r.cap, natural=a.natural,
                            thinking_tokens=a.thinking, answer_tokens=a.answer, prompt_tokens=a.prompt, grid=a.grid,
                            train_perfect=a.train_perfect, demos_right=a.demos_right,
                            program_outputs=a.program_outputs, started_s=start, finished_s=end)
              for r, a, start, end in run.finished]
    wrong = replace(serving, step_a=0.5)  # the step model far off: the trace replaces it
    result = backtest(logged, real_inputs, truth, schedule, wrong, Trace((0.0,), (0.05,)))
    assert result.matched == len(logged) and result.finish_error_s < 1e-6
    assert backtest(logged, real_inputs, truth, schedule, wrong).finish_error_s > 60
    assert backtest(logged, real_inputs, truth, schedule, serving, Trace((0.0,), (0.06,))).finish_error_s > 60


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


def test_each_slot_draws_the_same_attempt_whatever_the_timing(world):
    """Common random numbers: a base run and one with a larger cache draw the same attempt for the same (input,
    attempt) slot, though the requests start at other times and in another order."""
    _, _, inputs, truth, pool = world
    schedule = load_profile("moe-4xL4").schedule
    drawn: list[dict] = [{}, {}]

    def recorder(book):
        def draw(request, rng):
            attempt = pool.draw(request, rng)
            book[(request.key, request.attempt, request.level, request.cap)] = attempt
            return attempt
        return draw

    for book, kv in zip(drawn, (1_000_000, 1_300_000)):
        simulate(schedule, inputs, recorder(book), SharedEngine(replace(MOE, kv_tokens=kv)), truth, 7)
    common = drawn[0].keys() & drawn[1].keys()
    starts = {key: i for i, key in enumerate(drawn[0])}, {key: i for i, key in enumerate(drawn[1])}
    assert len(common) > 150
    assert sum(starts[0][k] != starts[1][k] for k in common) > 50  # the order did change
    assert all(drawn[0][k] == drawn[1][k] for k in common)


@pytest.mark.timeout(900)  # 240 runs of a cache-bound engine: about a minute on a quiet machine
def test_sensitivity_is_reproducible_across_seeds(world):
    """+1% throughput and +1% KV cache, 40 pairs each, on two disjoint seed sets: the same sign and estimates within
    two combined standard errors of each other (the 95% band of the difference of two independent estimates), on a
    cache-bound engine so that both resources matter. At +1% a pair's difference is mostly noise (a slightly larger
    cache moves admissions and so which attempts the deadline cuts): with 12 pairs the cache's estimate changed sign
    between seed sets; 40 pairs are needed here, and the default step is 5%."""
    _, _, inputs, truth, pool = world
    schedule = load_profile("moe-4xL4").schedule
    serving = replace(MOE, kv_tokens=1_200_000)
    first, second = (sensitivity(schedule, inputs, truth, pool, serving, pairs=40, seed=seed, step=0.01)
                     for seed in (0, 1000))
    for a, b in zip(first, second):
        assert a.resource == b.resource and a.standard_error > 0
        assert a.per_percent > 0 and b.per_percent > 0, (a, b)
        assert abs(a.per_percent - b.per_percent) <= 2 * (a.standard_error ** 2 + b.standard_error ** 2) ** 0.5


def test_a_made_up_input_runs_with_its_own_prompt(world):
    _, _, inputs, truth, pool = world
    schedule = load_profile("moe-4xL4").schedule
    prompts = {i.key: i.prompt_tokens for i in inputs}
    seen = []

    def duration(job):
        seen.append((job.key[:2], job.prompt))
        return job.tokens / 8.0

    simulate(schedule, inputs, pool.draw, LatencyEngine(duration), truth, 0)
    made_up = [(key, prompt) for key, prompt in seen if key[0].startswith("made-up")]
    assert len(made_up) > 100 and all(prompt == prompts[key] for key, prompt in made_up)


def test_the_set_has_the_asked_number_of_tasks_and_test_inputs(arc_data):
    tasks = load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks
    inputs, truth = build_inputs(tasks, {}, 300, random.Random(0), test_inputs=420)
    assert len(inputs) == len(truth) == 420 and len({i.task_id for i in inputs}) == 300
    with pytest.raises(ValueError, match="test inputs: 2000"):
        build_inputs(tasks, {}, 300, random.Random(0), test_inputs=2000)
    # Made-up tasks with the asked inputs per task: 180 of them, about 60% single-input.
    inputs, _ = build_inputs(tasks, {}, 300, random.Random(0), inputs_per_task=parse_counts("1:0.6,3:0.4"))
    made_up = [i for i in inputs if i.task_id.startswith("made-up")]
    per_task = {i.task_id: i.task_inputs for i in made_up}
    assert len(per_task) == 180 and set(per_task.values()) == {1, 3} and len(made_up) == sum(per_task.values())
    assert 0.5 < sum(c == 1 for c in per_task.values()) / 180 < 0.7
    with pytest.raises(ValueError, match="inputs_per_task"):
        make_scenario({}, {"inputs_per_task": "5:1"})


def test_throughput_is_converted_to_the_step_time_model():
    scenario = make_scenario({}, {"profile": "moe-4xL4", "throughput_tok_s": 600.0, "throughput_running": 40,
                                  "kv_tokens": 900_000, "schedule": (("cap_second", 30_000), ("repair_caps", "8000"))})
    resolved = resolve(scenario)
    assert resolved.serving.throughput(40, 30_000) == pytest.approx(600.0)
    assert resolved.serving.kv_tokens == 900_000
    assert resolved.schedule.cap_second == 30_000 and resolved.schedule.repair_caps == (8000,)
    assert any("divided by" in note for note in resolved.notes)
    with pytest.raises(ValueError, match="no field 'cap_sekond'"):
        make_scenario({}, {"schedule": (("cap_sekond", 1),)})


def test_example_log_options_shape_the_log(arc_data):
    tasks = load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks
    rare = make_records(tasks, 0, LogShape(natural_rate=0.3))
    assert 0.22 < statistics.fmean(r.natural for r in rare) < 0.38
    assert all(r.thinking_tokens == 96_000 for r in rare if not r.natural)
    falling = make_records(tasks, 0, LogShape(accuracy_by_length=parse_bins("30000:2.0,96000:0.2")))

    def accuracy(records, short):
        picked = [r for r in records if r.natural and (r.thinking_tokens <= 30_000) == short]
        return statistics.fmean(r.grid == tasks_by_id[r.task_id].test_outputs[r.test_index] for r in picked)

    tasks_by_id = {t.id: t for t in tasks}
    assert accuracy(falling, True) > accuracy(falling, False) + 0.3
    with pytest.raises(ValueError):
        parse_bins("9000:1,8000:1")


def test_example_log_takes_inputs_per_task(arc_data, tmp_path, capsys):
    """--inputs-per-task logs the tasks in the asked mix of test-input counts (the evaluation set has 75 single-input
    and 43 two-input tasks: an even mix is 43 of each), every input of a logged task with its attempts."""
    evaluation = arc_data / "arc-agi-2" / "evaluation"
    out = tmp_path / "even.jsonl"
    main_example_log(["--tasks", str(evaluation), "--out", str(out), "--inputs-per-task", "1:0.5,2:0.5"])
    assert "for 86 tasks" in capsys.readouterr().out
    records = [json.loads(line) for line in out.read_text().splitlines()]
    tasks = {t.id: t for t in load_tasks(evaluation).tasks}
    logged: dict[str, set] = {}
    for r in records:
        logged.setdefault(r["task_id"], set()).add((r["test_index"], r["attempt"]))
    counts = [len(tasks[t].test_inputs) for t in logged]
    assert counts.count(1) == counts.count(2) == 43 and len(counts) == 86
    assert all(v == {(i, a) for i in range(len(tasks[t].test_inputs)) for a in (1, 2, 3)} for t, v in logged.items())
    mostly_single = make_records(list(tasks.values()), 0, LogShape(inputs_per_task=parse_counts("1:0.9,2:0.1")))
    assert len({r.task_id for r in mostly_single}) == round(75 / 0.9)  # the single-input tasks are the limit
    for bad, message in (("4:1", "no task has 4 test inputs"), ("5:1", "counts 1-4")):
        with pytest.raises(SystemExit):
            main_example_log(["--tasks", str(evaluation), "--out", str(out), "--inputs-per-task", bad])
        assert message in capsys.readouterr().err


def test_scenario_file_json_and_plots(arc_data, tmp_path):
    """`make simulate`'s path with a scenario TOML: it prints the scenario, sweeps a cache size, writes JSON, PNGs."""
    scenario = tmp_path / "scenario.toml"
    scenario.write_text('profile = "moe-4xL4"\nkv_tokens = 1200000\nruns = 3\nsweep = "kv_tokens=600000"\n'
                        "[schedule]\ncap_first_single = 80000\n")
    log = str(REPO / "sim/data/example_attempts.jsonl")
    out = subprocess.run([sys.executable, "-m", "sim", "forecast", "--log", log,
                          "--tasks", str(arc_data / "arc-agi-2" / "evaluation"), "--scenario", str(scenario),
                          "--bootstraps", "50", "--out", str(tmp_path), "--json", str(tmp_path / "r.json")],
                         cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "scenario: profile moe-4xL4" in out.stdout and "kv_tokens = 1,200,000" in out.stdout
    assert "schedule.cap_first_single = 80000 (profile: 75000)" in out.stdout  # the agent's 75K budget
    report = json.loads((tmp_path / "r.json").read_text())
    assert report["scenario"]["kv_tokens"] == 1_200_000 and report["scenario"]["schedule"]["cap_first_single"] == 80000
    forecast_ = report["forecast"]
    assert len(forecast_["scores"]) == 3 and {"skipped_cap_too_small", "never_started", "preemptions",
                                              "engine_wait_s_mean"} <= forecast_.keys()
    assert [row["variant"] for row in report["sweep"]] == ["kv_tokens=600000"]
    assert report["sweep"][0]["engine_wait_s_mean"] > forecast_["engine_wait_s_mean"]  # half the cache: longer waits
    for name in ("timeline.png", "distribution.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    bad = subprocess.run([sys.executable, "-m", "sim", "forecast", "--log", "x", "--tasks", "y", "--scenario",
                          str(scenario), "--sweep", "kv_tokenz=1"], cwd=REPO, capture_output=True, text=True)
    assert bad.returncode == 2 and "kv_tokenz" in bad.stderr


def test_a_calibrated_model_is_written_as_toml_that_loads_back(tmp_path):
    """`sim calibrate` writes every field, booleans included (reserve_full_isl = True was not TOML)."""
    from sim.calibrate import to_toml
    from sim.serving import load_serving

    model = replace(MOE, max_num_batched_tokens=8192, draft_tokens=4, reserve_full_isl=False)
    path = tmp_path / "serving.toml"
    path.write_text(to_toml(model, "a note"))
    assert load_serving(path) == model


@pytest.mark.parametrize("edit, message", [
    (lambda text: text + "kv_tokenz = 5\n", r"serving.toml: unknown key\(s\) kv_tokenz"),
    (lambda text: text.replace("max_num_seqs = ", "# "), r"serving.toml: missing key\(s\) max_num_seqs"),
    (lambda text: text.replace("reserve_full_isl = false", 'reserve_full_isl = "no"'),
     r"serving.toml.reserve_full_isl: expected bool"),
])
def test_a_serving_model_file_with_a_bad_key_is_refused_naming_file_and_key(tmp_path, edit, message):
    """Serving models are read as strict TOML (submission.strict_toml, issue 30): the file and the key in the error."""
    from sim.calibrate import to_toml
    from sim.serving import load_serving

    path = tmp_path / "serving.toml"
    path.write_text(edit(to_toml(replace(MOE, reserve_full_isl=False), "a note")))
    with pytest.raises(ValueError, match=message):
        load_serving(path)


def test_a_scenario_file_with_an_unknown_key_is_refused_naming_file_and_key(tmp_path):
    from sim.scenario import read_scenario

    path = tmp_path / "scenario.toml"
    path.write_text('profile = "moe-4xL4"\n[schedule]\ncap_frist = 1\n')
    with pytest.raises(ValueError, match=r"scenario.toml.schedule: unknown key\(s\) cap_frist"):
        read_scenario(path)
    path.write_text('profil = "moe-4xL4"\n')
    with pytest.raises(ValueError, match=r"scenario.toml: unknown key\(s\) profil"):
        read_scenario(path)
