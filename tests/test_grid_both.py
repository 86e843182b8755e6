"""Both lines in one run (issue 18, item 8): the merge rule, and a combined run on CPU (the reasoning line on the
replay engine, the grid line on one worker with a tiny 16-token model) whose answer file is the merge of both logs."""

from __future__ import annotations

import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from submission.attempts import AttemptRecord, GridDetail, read_log
from submission.grid.rescore import Candidate as GridCandidate
from submission.grids import EMPTY_ANSWER
from submission.merge import merge_logs, merged_answers, merged_order
from submission.schedule import Level
from submission.selection import Candidate, Source

REPO = Path(__file__).resolve().parents[1]
A, B, C, D, E, F = (((i,),) for i in range(1, 7))


def test_tiers_programs_then_grid_search_then_reasoning_grids_then_fallback():
    reasoning = [Candidate(C, Source.GRID, 1), Candidate(C, Source.GRID, 2), Candidate(D, Source.GRID, 3),
                 Candidate(A, Source.PROGRAM, 3)]
    grid_line = [GridCandidate(B, 2, 1.5), GridCandidate(E, 1, 0.2), GridCandidate(F, 0, 0.1)]
    # a program output first even against a grid with two votes; the grid line's found grids by hits - NLL
    # (E: 0.8 before B: 0.5); then the reasoning grids by votes; the 0-hit fallback last
    assert merged_order(reasoning, grid_line) == [A, E, B, C, D, F]
    assert merged_answers(reasoning, grid_line) == (A, E)


def test_a_grid_both_lines_propose_counts_once_in_its_best_tier():
    reasoning = [Candidate(B, Source.GRID, 1)]
    assert merged_order(reasoning, [GridCandidate(B, 1, 3.0), GridCandidate(A, 0, 0.0)]) == [B, A]
    assert merged_answers(reasoning, [GridCandidate(B, 0, 3.0)]) == (B, EMPTY_ANSWER)
    assert merged_answers([], []) == (EMPTY_ANSWER, EMPTY_ANSWER)


def test_merge_logs_takes_each_lines_records_and_a_redone_tasks_last_candidates():
    reasoning = [AttemptRecord("t", 0, 1, Level.FIRST, 0, 100, grid=C),
                 AttemptRecord("other", 0, 1, Level.FIRST, 0, 100, grid=C)]  # not in this run's tasks
    grid_line = [AttemptRecord("t", 1, 1, Level.FIRST, 0, 0, grid=A,
                               grid_line=GridDetail(candidates=(GridCandidate(A, 1, 0.5).to_json(),))),
                 AttemptRecord("t", 1, 1, Level.FIRST, 0, 0, grid=B,  # the task redone after a kill
                               grid_line=GridDetail(candidates=(GridCandidate(B, 0, 0.5).to_json(),))),
                 AttemptRecord("t", 1, 2, Level.SECOND, 0, 0, grid=B, grid_line=GridDetail(worker=0))]
    assert merge_logs({"t": 2}, reasoning, grid_line) == {("t", 0): (C, EMPTY_ANSWER), ("t", 1): (B, EMPTY_ANSWER)}




@pytest.mark.usefixtures("one_torch_thread")
def test_a_combined_run_writes_the_merge_of_both_lines(arc_data, tmp_path, replay_profile):
    pytest.importorskip("peft")
    from dataclasses import replace

    from build.models.grid_vocab import cut
    from build.models.tiny import make_checkpoint
    from submission.grid.queue import task_cost
    from submission.profiles import load_grid_profile, to_toml
    from submission.tasks import load_tasks

    # the two cheapest evaluation tasks, in a folder of their own (the run takes a folder's tasks by id)
    evaluation = tmp_path / "tasks"
    evaluation.mkdir()
    tasks = sorted(load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks, key=task_cost)[:2]
    for task in tasks:
        shutil.copy(arc_data / "arc-agi-2" / "evaluation" / f"{task.id}.json", evaluation)
    # the reasoning line's earlier run: the right grid twice for the first task's inputs, wrong 1x1 grids elsewhere
    rng, logged = random.Random(0), []
    for task in tasks:
        for index, label in enumerate(task.test_outputs):
            for attempt in (1, 2):
                grid = label if task is tasks[0] else ((rng.randrange(10),),)
                logged.append(AttemptRecord(task.id, index, attempt, Level(attempt - 1), 0, 4000, natural=True,
                                            thinking_tokens=200, answer_tokens=50, grid=grid))
    (tmp_path / "earlier.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in logged))
    replay = replay_profile(tmp_path, tmp_path / "earlier.jsonl")
    grid_model = cut(make_checkpoint(tmp_path / "base", "qwen3", seed=4), tmp_path / "grid-model")
    grid = load_grid_profile("grid-tiny")
    grid = replace(grid, ttt=replace(grid.ttt, sequences=2),
                   search=replace(grid.search, dihedrals=1, colour_perms=2, batch_s=2.0, preload=True),
                   rescore=replace(grid.rescore, views=1),
                   run=replace(grid.run, min_task_s=2.0, max_task_s=4.0))
    (tmp_path / "grid.toml").write_text(to_toml(grid))
    (tmp_path / "both.toml").write_text(
        f'line = "both"\npoll_s = 0.5\n[reasoning]\nprofile = "{replay}"\n'
        f'[grid]\nprofile = "{tmp_path / "grid.toml"}"\nworkers = ["cpu"]\nmodel = "{grid_model}"\n')
    out = tmp_path / "run" / "submission.json"
    # a roomy deadline (the run ends when both lines have finished): a busy shared machine starts workers slowly
    done = subprocess.run([sys.executable, "-m", "submission.main", "--tasks", str(evaluation), "--profile",
                           str(tmp_path / "both.toml"), "--deadline", "300", "--out", str(out), "--solutions",
                           str(evaluation), "--heartbeat", str(tmp_path / "run" / "heartbeat.json")], cwd=REPO,
                          capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    # each line's heartbeat beside its log, and the run's own (boot's supervisor reads it): all ended "done"
    from submission.heartbeat import read

    beats = [read(tmp_path / "run" / name) for name in ("reasoning/attempts.heartbeat.json",
                                                        "grid/attempts.heartbeat.json", "heartbeat.json")]
    assert [b.phase for b in beats] == ["done"] * 3 and all(b.attempts for b in beats[:2])
    assert beats[1].quiet_s > 4.0 and beats[0].engine_tokens > 0  # the grid line's longest task; replayed tokens
    reasoning_log = read_log(tmp_path / "run" / "reasoning" / "attempts.jsonl")
    grid_log = read_log(tmp_path / "run" / "grid" / "attempts.jsonl")
    counts = {t.id: len(t.test_inputs) for t in tasks}
    assert {r.task_id for r in reasoning_log} == {r.task_id for r in grid_log} == set(counts)  # both lines ran
    merged = merge_logs(counts, reasoning_log, grid_log)
    answer = json.loads(out.read_text())
    assert {(t, i): (tuple(map(tuple, s["attempt_1"])), tuple(map(tuple, s["attempt_2"])))
            for t, slots in answer.items() for i, s in enumerate(slots)} == merged  # the last write has both logs
    grid_only = json.loads((tmp_path / "run" / "grid" / "submission.json").read_text())
    first = tasks[0]
    for index, label in enumerate(first.test_outputs):
        found = [r for r in grid_log if r.attempt == 1 and r.task_id == first.id and r.test_index == index]
        if any(c["hits"] for c in found[-1].grid_line.candidates):
            continue  # the random model found an answer in a view: it ranks before the reasoning grids (tier 2)
        # the reasoning line's right grid first, the grid line's fallback answer second: both lines in one slot
        assert answer[first.id][index]["attempt_1"] == [list(row) for row in label]
        assert answer[first.id][index]["attempt_2"] == grid_only[first.id][index]["attempt_1"]
    assert "score (both)" in done.stdout and "score (grid line)" in done.stdout
    again = subprocess.run(done.args, cwd=REPO, capture_output=True, text=True, timeout=100)
    assert again.returncode == 2 and "--resume" in again.stderr  # an earlier run's logs are never merged by mistake


def test_shipped_combined_profiles_give_each_line_its_share(tmp_path):
    from submission.profiles import (ProfileError, is_grid_profile, line_profiles, load_both_profile, load_grid_profile,
                                     load_profile)

    assert is_grid_profile("both-4xL4") and load_both_profile("both-tiny").grid.workers == ("cpu",)
    both = load_both_profile("both-4xL4")
    reasoning, grid = line_profiles(both, 3600.0)
    (tmp_path / "r.toml").write_text(reasoning)
    (tmp_path / "g.toml").write_text(grid)
    r, g = load_profile(tmp_path / "r.toml"), load_grid_profile(tmp_path / "g.toml")
    assert (r.engine.tensor_parallel_size, r.schedule.time_limit_s, both.reasoning.devices) == (2, 3600.0, "0,1")
    assert (g.run.devices, g.run.max_len, g.run.time_limit_s, both.grid.devices) == (
        ("cuda:0", "cuda:1"), (13312, 12288), 3600.0, "2,3")
    assert g.ttt == load_grid_profile("grid-4b-4xL4").ttt  # the rest is the line's own profile
    # the commit run's rehearsal (--scale-schedule): both lines' margins and caps scaled to its deadline
    from dataclasses import replace

    from submission.profiles import line_configs

    r, g = line_configs(load_both_profile("both-tiny"), 600.0, scale=True)
    assert r.schedule == load_profile("cpu-tiny").schedule.scaled(600.0) and r.schedule.cap_first_single == 192
    assert g.run == replace(load_grid_profile("grid-tiny").run, devices=("cpu",), max_len=(4096,)).scaled(600.0)
    (tmp_path / "bad.toml").write_text('line = "both"\n[grid]\nworkerz = ["cpu"]\n')
    with pytest.raises(ProfileError, match="workerz"):
        load_both_profile(tmp_path / "bad.toml")


def test_a_combined_bundle_takes_both_models_each_for_its_line(tmp_path, capsys):
    """Refused before anything is copied: a combined profile without its grid model, either model the wrong one for
    its line, a grid model for a one-line profile, two line profiles that need different wheels (tests/
    test_offline_boot.py builds and boots the combined bundle)."""
    from build.bundle.bundler import bundle
    from build.pipeline import main as pipeline

    reasoning, grid = tmp_path / "reasoning", tmp_path / "grid"
    for folder, vocab in ((reasoning, 151936), (grid, 16)):
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps({"vocab_size": vocab}))
    out = tmp_path / "bundle"
    with pytest.raises(ValueError, match="both-tiny: a combined profile bundles two models.*--grid-model"):
        bundle("both-tiny", reasoning, out)
    with pytest.raises(ValueError, match=f"{grid}: vocab_size 16: the reasoning line needs a full vocabulary"):
        bundle("both-tiny", grid, out, grid_model=grid)
    with pytest.raises(ValueError, match=f"{reasoning}: vocab_size 151936: the grid line needs the 16-token"):
        bundle("both-tiny", reasoning, out, grid_model=reasoning)
    with pytest.raises(ValueError, match="cpu-tiny: a reasoning-line profile bundles one model"):
        bundle("cpu-tiny", reasoning, out, grid_model=grid)
    assert not out.exists() and not out.with_name("bundle.partial").exists()
    mixed = tmp_path / "both-mixed.toml"
    mixed.write_text('line = "both"\n[reasoning]\nprofile = "cpu-tiny"\n[grid]\nprofile = "grid-4b-4xL4"\n')
    with pytest.raises(SystemExit):
        pipeline(["--profile", str(mixed), "--out", str(tmp_path / "out")])
    assert (f"{mixed}: reasoning.profile cpu-tiny builds for target 'cpu-py311', grid.profile grid-4b-4xL4 for "
            "'kaggle-gpu-py311'") in capsys.readouterr().err


def test_a_bundle_takes_the_model_its_line_runs():
    from build.bundle.bundler import bundled_line, model_problem

    assert bundled_line("grid-4b-4xL4") == "grid" and bundled_line("cpu-tiny") == "reasoning"
    assert bundled_line("both-4xL4") == bundled_line("both-tiny") == "both"
    assert model_problem("grid", {"vocab_size": 16}) == model_problem("reasoning", {"vocab_size": 151936}) == ""
    assert "build.models.grid_vocab" in model_problem("grid", {"vocab_size": 151936})
    assert "full vocabulary" in model_problem("reasoning", {"vocab_size": 16})


def test_the_shipped_grid_profile_is_the_studys_and_kit16_the_named_alternative(tmp_path):
    """Issue 45: grid-4b-4xL4 runs NVARC's format with the ckpt adapter loaded unmerged, from inside the bundled
    model folder (so its bundle, and both-4xL4's, must carry the adapter); grid-4b-4xL4-kit16 differs in the model
    alone."""
    from build.bundle.bundler import adapter_problem, grid_adapter
    from submission.profiles import load_grid_profile

    study, kit16 = load_grid_profile("grid-4b-4xL4"), load_grid_profile("grid-4b-4xL4-kit16")
    assert (study.model.format, study.model.adapter, study.model.merge) == ("nvarc", "adapter", False)
    assert (kit16.model.format, kit16.model.adapter) == ("kit16", "")
    assert (study.ttt, study.search, study.rescore, study.run, study.build) == (
        kit16.ttt, kit16.search, kit16.rescore, kit16.run, kit16.build)
    assert grid_adapter("grid-4b-4xL4", "grid") == grid_adapter("both-4xL4", "both") == "adapter"
    model = tmp_path / "nvarc-4b"
    model.mkdir()
    assert "adapter/adapter_config.json is missing" in adapter_problem("adapter", None, model)
    assert grid_adapter("grid-4b-4xL4-kit16", "grid") == "" and adapter_problem("", None, model) == ""
