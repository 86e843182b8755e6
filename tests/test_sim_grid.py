"""The grid-line forecast: logged tasks read back from attempt records, the queue on a simulated clock."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from sim.grid import logged_tasks, main, one_run
from submission.attempts import AttemptLog, AttemptRecord, GridDetail
from submission.grid.queue import task_cost
from submission.grid.rescore import Candidate
from submission.profiles import PROFILES, load_grid_profile
from submission.schedule import Level
from submission.tasks import load_tasks


@pytest.fixture(scope="module")
def tasks(arc_data):
    return load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks[:6]


def _records(tasks):
    """Tasks 0, 2, 4 answered right by attempt 2; each used 90% of a 2,000 s limit."""
    out = []
    for n, task in enumerate(tasks):
        for index, label in enumerate(task.test_outputs):
            detail = GridDetail(time_limit_s=2000.0, stage_s={"ttt": 800.0, "search": 700.0, "rescore": 300.0})
            out.append(AttemptRecord(task.id, index, 1, Level.FIRST, 0, 0, grid=((0,),), grid_line=detail))
            out.append(AttemptRecord(task.id, index, 2, Level.SECOND, 0, 0, grid=label if n % 2 == 0 else ((1,),),
                                     grid_line=GridDetail(worker=0)))
    return out


def test_logged_tasks_read_right_answers_and_time(tasks):
    logged = logged_tasks(_records(tasks), {t.id: t for t in tasks})
    assert [t.right for t in logged] == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert all(t.used == pytest.approx(0.9) for t in logged)


def test_the_deadline_decides_how_many_tasks_are_answered(tasks):
    logged = logged_tasks(_records(tasks), {t.id: t for t in tasks})
    profile = load_grid_profile("grid-4b-4xL4")  # 4 workers, 12 h, limits 517-3,000 s
    roomy = one_run(logged, profile, 40, random.Random(0))
    assert roomy.answered == 40 and roomy.score in {100 * k / 40 for k in range(41)}
    short = replace(profile, run=replace(profile.run, time_limit_s=3 * 3600.0))
    tight = one_run(logged, short, 240, random.Random(0))
    # 4 workers x (3 h - 7 min) at >= 517 s x 0.9 per task: at most ~93 tasks
    assert profile.run.min_task_s == 517.0
    assert 0 < tight.answered <= 4 * (3 * 3600 - 420) / (517.0 * 0.9) + 4
    # issue 45: the forecast gives every task its full training when the run affords it, and only then
    assert roomy.short_training == 0 and tight.short_training > 0


def test_command_line(tasks, tmp_path, capsys, arc_data):
    log = AttemptLog(tmp_path / "attempts.jsonl")
    for record in _records(tasks):
        log.append(record)
    log.close()
    assert main(["--log", str(tmp_path / "attempts.jsonl"), "--tasks", str(arc_data / "arc-agi-2" / "evaluation"),
                 "--hidden-tasks", "24", "--runs", "5"]) == 0
    out = capsys.readouterr().out
    assert "forecast score" in out and "answered by the deadline 24.0 of 24" in out and "ttt 800.0" in out
    assert "training cut short by the forecast (fewer steps than sequences may run) in 0.0 of them" in out


def _both_logs(tasks):
    """The grid line right on tasks 0, 2, 4 (2 hits), wrong elsewhere (1 hit); the reasoning line right on 1, 3, 5."""
    grid, reasoning = [], []
    for n, task in enumerate(tasks):
        for index, label in enumerate(task.test_outputs):
            answer = label if n % 2 == 0 else ((1,),)
            detail = GridDetail(time_limit_s=2000.0, stage_s={"ttt": 800.0, "search": 700.0, "rescore": 300.0},
                                candidates=(Candidate(answer, 2 if n % 2 == 0 else 1, 0.5).to_json(),))
            grid.append(AttemptRecord(task.id, index, 1, Level.FIRST, 0, 0, grid=answer, grid_line=detail))
            grid.append(AttemptRecord(task.id, index, 2, Level.SECOND, 0, 0, grid=answer,
                                      grid_line=GridDetail(worker=0)))
            for attempt in (1, 2):
                reasoning.append(AttemptRecord(task.id, index, attempt, Level(attempt - 1), 0, 56000, natural=True,
                                               thinking_tokens=4000, answer_tokens=100, prompt_tokens=3000,
                                               grid=label if n % 2 else ((2,),)))
    return grid, tuple(reasoning)


def test_the_split_merges_both_lines_on_the_same_drawn_tasks(tasks):
    from sim.grid import Split, compare
    from sim.serving import ServingModel
    from submission.profiles import load_profile

    grid_records, reasoning_records = _both_logs(tasks)
    by_id = {t.id: t for t in tasks}
    logged = logged_tasks(grid_records, by_id)
    grid_all = load_grid_profile("grid-4b-4xL4")
    grid_split = replace(grid_all, run=replace(grid_all.run, devices=("cuda:0", "cuda:1")))
    serving = ServingModel(0.5, 0.0, 0.0, 0.0, 0.0, 4_000_000, 64, 16)  # every attempt runs within 12 h
    split = Split(load_profile("dense-27b-4xL4").schedule, reasoning_records, serving, 0.5)
    for seed in range(3):
        c = compare(logged, grid_records, by_id, grid_all, grid_split, split, 24, random.Random(seed))
        # the lines are right on complementary tasks of the same draw; merged, every task is right
        assert c.grid_only + c.reasoning_only == pytest.approx(100.0)
        assert 0 < c.grid_only < 100 and c.both == pytest.approx(100.0)
    # a reasoning line left next to no GPU answers nothing: the split scores as the grid line alone
    starved = compare(logged, grid_records, by_id, grid_all, grid_split, replace(split, share=0.01), 24,
                      random.Random(0))
    assert starved.both == pytest.approx(starved.grid_only)


def _write_logs(tasks, folder):
    """Both lines' logs of _both_logs as grid.jsonl and reasoning.jsonl in `folder`."""
    grid_records, reasoning_records = _both_logs(tasks)
    for name, records in (("grid.jsonl", grid_records), ("reasoning.jsonl", reasoning_records)):
        log = AttemptLog(folder / name)
        for record in records:
            log.append(record)
        log.close()


def test_command_line_compares_the_three_arrangements(tasks, tmp_path, capsys, arc_data):
    _write_logs(tasks, tmp_path)
    assert main(["--log", str(tmp_path / "grid.jsonl"), "--tasks", str(arc_data / "arc-agi-2" / "evaluation"),
                 "--reasoning-log", str(tmp_path / "reasoning.jsonl"), "--both", "both-4xL4",
                 "--hidden-tasks", "12", "--runs", "2"]) == 0
    out = capsys.readouterr().out
    assert "6 tasks in both logs" in out and "reasoning line on 50% of the GPUs, the grid line on 2 workers" in out
    assert "all GPUs to the grid line: forecast score" in out and "the split, answers merged (both-4xL4)" in out


def test_the_reasoning_side_is_served_with_its_profiles_budget_and_drafts(tasks, tmp_path, arc_data, monkeypatch):
    """The serving model of the split's reasoning line carries that line's chunked-prefill budget and draft tokens
    (sim.scenario.for_profile), as a forecast's does: both-4xL4's dense-27b-4xL4 has 4,096 and 3."""
    import sim.grid

    _write_logs(tasks, tmp_path)
    seen = []

    def compare(*args):  # record the reasoning side each simulated run is given
        seen.append(args[5])
        return sim.grid.Comparison(0.0, 0.0, 0.0)

    monkeypatch.setattr(sim.grid, "compare", compare)
    assert main(["--log", str(tmp_path / "grid.jsonl"), "--tasks", str(arc_data / "arc-agi-2" / "evaluation"),
                 "--reasoning-log", str(tmp_path / "reasoning.jsonl"), "--both", "both-4xL4",
                 "--hidden-tasks", "12", "--runs", "1"]) == 0
    assert [(s.serving.max_num_batched_tokens, s.serving.draft_tokens) for s in seen] == [(4096, 3)]


@pytest.mark.parametrize("name", sorted(p.stem for p in PROFILES.glob("*.toml")
                                        if 'line = "both"' in p.read_text()))
def test_the_forecast_splits_the_machine_as_the_run_does(name, tmp_path):
    """The split sim.grid forecasts is the one the combined run starts: the profiles it writes for its lines
    (line_profiles) with the deadline each line is given (the run's less MERGE_S), every override applied."""
    from sim.grid import split_lines
    from submission.profiles import MERGE_S, line_profiles, load_both_profile, load_profile

    both = load_both_profile(name)
    reasoning, grid, share = split_lines(both)
    for text, path in zip(line_profiles(both, both.time_limit_s), ("r.toml", "g.toml")):
        (tmp_path / path).write_text(text)
    limit = both.time_limit_s - MERGE_S
    run_reasoning = load_profile(tmp_path / "r.toml")
    run_reasoning = replace(run_reasoning, schedule=replace(run_reasoning.schedule, time_limit_s=limit))
    run_grid = load_grid_profile(tmp_path / "g.toml")
    run_grid = replace(run_grid, run=replace(run_grid.run, time_limit_s=limit))
    assert (reasoning, grid) == (run_reasoning, run_grid)
    gpus = reasoning.engine.tensor_parallel_size * reasoning.engine.pipeline_parallel_size
    assert share == gpus / (gpus + len(grid.run.devices))
    if name == "both-4xL4":  # two L4s each: the reasoning line at TP2, two grid workers at their own contexts
        assert (gpus, grid.run.devices, grid.run.max_len, share) == (2, ("cuda:0", "cuda:1"), (13312, 12288), 0.5)


def test_the_l4_budget_gives_every_hidden_task_a_turn(arc_data):
    """240 tasks like ARC-AGI-2's evaluation set on four L4s, each using its whole limit (a kit slower than NVARC's):
    under grid-4b-4xL4's budget by size all are answered by the deadline; under the study's bounds alone (1,200 s
    floor, equal shares) only ~144 are (issue 29, section 6)."""
    from sim.grid import LoggedTask

    logged = [LoggedTask(t.id, task_cost(t), 1.0, 1.0, {})
              for t in load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks]
    profile = load_grid_profile("grid-4b-4xL4")
    full = one_run(logged, profile, 240, random.Random(0))
    assert full.answered == 240 and full.short_training == 0  # and every one trains all its steps (issue 45)
    study = replace(profile, run=replace(profile.run, min_task_s=1200.0, size_tokens=(), task_s=(), ttt_s=()))
    assert one_run(logged, study, 240, random.Random(0)).answered < 150
