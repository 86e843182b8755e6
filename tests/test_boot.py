"""submission/kaggle/boot.py: every wait ends before the time limit, and the commit run's rehearsal (the bundle's
profile on a few public evaluation tasks, the schedule scaled to a short deadline) makes, writes and scores an attempt
per task, or fails loudly. The rehearsal runs the real solver on the CPU target: the tiny random-weight Qwen3 and the hf
engine (engine environment)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import pytest

from submission.kaggle import boot

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("elapsed", [0.0, 600.0, 6 * 3600.0, boot.TIME_LIMIT_S - 400, boot.TIME_LIMIT_S - 61])
def test_every_wait_ends_before_the_time_limit(elapsed):
    """Issue 12: boot waited `deadline + 60` for the solver, past the limit. Now every step it waits for (install,
    preflight, the solver, the rehearsal) ends END_MARGIN_S before the limit, and the solver's own deadline (its
    watchdog) comes before boot's timeout."""
    started = 1_000_000.0
    now, end = started + elapsed, started + boot.TIME_LIMIT_S - boot.END_MARGIN_S
    for cap in (300.0, 3600.0, 1e9):
        assert now + boot.step_timeout(started, now, cap) <= end
    for rehearsal in (None, 1800.0):
        deadline, timeout = boot.solver_deadline(started, now, rehearsal)
        assert now + timeout <= end
        assert deadline <= 0 or now + deadline < now + timeout  # the solver's watchdog fires first
        assert rehearsal is None or deadline <= rehearsal


def test_rehearsal_problems_name_the_tasks_without_a_finished_attempt():
    line = lambda task, aborted=False: json.dumps({"task_id": task, "aborted": aborted})  # noqa: E731
    assert boot.rehearsal_problems(["a", "b"], [line("a"), line("b"), line("b", True)]) == []
    assert boot.rehearsal_problems(["a", "b"], [line("a"), line("b", True)]) == ["no attempt finished on task b"]
    assert boot.rehearsal_problems(["a", "b"], [line("a", True)]) == ["no attempt finished on any of the 2 "
                                                                      "rehearsal tasks"]
    assert boot.rehearsal_problems(["a"], []) == ["no attempt finished on any of the 1 rehearsal tasks"]


def test_a_combined_bundle_runs_both_lines_and_its_rehearsal_waits_for_each_log(tmp_path):
    line = lambda task, aborted=False: json.dumps({"task_id": task, "aborted": aborted}) + "\n"  # noqa: E731
    out = tmp_path / "rehearsal" / "submission.json"
    logs = boot.line_logs(out, tmp_path / "attempts.jsonl", tmp_path / "grid-model")
    assert logs == {"reasoning line": tmp_path / "rehearsal" / "reasoning" / "attempts.jsonl",
                    "grid line": tmp_path / "rehearsal" / "grid" / "attempts.jsonl"}
    assert boot.line_logs(out, tmp_path / "attempts.jsonl", None) == {"": tmp_path / "attempts.jsonl"}
    both = boot.solver_command("both-4xL4", Path("model"), Path("t.json"), out, 99.6, tmp_path / "attempts.jsonl",
                               Path("grid-model"))
    assert both[1:3] == ["-m", "submission.both"] and "--log" not in both and "--model" not in both
    assert [both[both.index(flag) + 1] for flag in ("--reasoning-model", "--grid-model", "--deadline")] == [
        "model", "grid-model", "99"]
    one = boot.solver_command("cpu-tiny", Path("model"), Path("t.json"), out, 99.6, tmp_path / "a.jsonl", None)
    assert one[1:3] == ["-m", "submission.main"] and one[one.index("--model") + 1] == "model"
    for path in logs.values():
        path.parent.mkdir(parents=True)
    reasoning, grid = logs.values()
    reasoning.write_text(line("a") + line("b"))
    assert not boot.finished_everywhere(["a", "b"], [reasoning, grid])  # the grid line has logged nothing yet
    grid.write_text(line("a") + line("b", aborted=True) + '{"task_id": "b"')  # aborted; then a line being written
    assert not boot.finished_everywhere(["a", "b"], [reasoning, grid])
    grid.write_text(line("a") + line("b"))
    assert boot.finished_everywhere(["a", "b"], [reasoning, grid])


FINISHED = "open(sys.argv[1], 'w').write('{\"task_id\": \"a\", \"aborted\": false}\\n')\n"


@pytest.mark.parametrize("solver, expected", [
    ("import signal, sys, time\nsignal.signal(signal.SIGTERM, lambda *_: sys.exit(143))\n" + FINISHED +
     "time.sleep(60)", 0),
    ("import sys, time\n" + FINISHED + "time.sleep(60)", 0),  # past its handler, shutting down: killed by the signal
    ("import sys\nsys.exit(3)", 3),  # a failure before every task had an attempt stays a failure
])
def test_a_rehearsal_ended_by_its_sigterm_counts_as_ended(tmp_path, solver, expected):
    """The rehearsal's SIGTERM can reach a solver that has finished and is shutting down, past its own handler: it
    then dies of the signal (-15) instead of exiting 143, and that is the same ending, not a failure."""
    log = tmp_path / "attempts.jsonl"
    command = [sys.executable, "-c", solver, str(log)]
    assert boot.run_rehearsal(command, tmp_path, dict(os.environ), 30.0, (["a"], [log])) == expected


CRASHES_ONCE = """
import json, os, sys
lives = os.path.join(os.path.dirname(__file__), "lives.jsonl")
with open(lives, "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
sys.exit(0 if "--resume" in sys.argv else 1)  # a crash in its first life; the relaunch finishes
"""


def test_a_solver_that_crashes_in_the_rerun_is_relaunched_with_resume(tmp_path, capfd):
    """Issue 27: boot ran the rerun's solver once, so a crash (or a second engine death, exit 1) ended the rerun's
    work with hours left. Now it is relaunched with --resume and the deadline that is left, its heartbeat beside the
    log. A stand-in `submission.main` in the bundle's kit folder crashes once."""
    kit = tmp_path / "bundle" / "kit"
    (kit / "submission").mkdir(parents=True)
    (kit / "submission" / "__init__.py").write_text("")
    (kit / "submission" / "main.py").write_text(CRASHES_ONCE)
    args = argparse.Namespace(bundle=tmp_path / "bundle", started=time.time(), rehearsal_deadline=1800.0)
    quick = boot.SuperviseConfig(restart_spacing_s=0.2)
    log = tmp_path / "attempts.jsonl"
    status = boot.solve(args, "cpu-tiny", tmp_path / "model", dict(os.environ), tmp_path / "t.json",
                        tmp_path / "submission.json", None, log, supervision=quick)
    assert status == 0
    first, second = [json.loads(line) for line in (kit / "submission" / "lives.jsonl").read_text().splitlines()]
    assert "--resume" not in first and second.count("--resume") == 1
    assert first[first.index("--heartbeat") + 1] == str(tmp_path / "attempts.heartbeat.json")
    assert float(second[second.index("--deadline") + 1]) <= float(first[first.index("--deadline") + 1])
    assert "boot: supervise: the solver exited with status 1: relaunch 1 of at most 3, with --resume" in (
        capfd.readouterr().out)


@pytest.fixture(scope="module")
def kaggle_input(tmp_path_factory, arc_data):
    """/kaggle/input as the commit run sees it: the public evaluation challenges and solutions (the five smallest real
    tasks: short prompts for the CPU), and a bundle whose kit is this repository (the rehearsal runs kit/'s solver)."""
    root = tmp_path_factory.mktemp("kaggle")
    files = sorted((arc_data / "arc-agi-2" / "evaluation").glob("*.json"), key=lambda f: f.stat().st_size)[:5]
    tasks = {f.stem: json.loads(f.read_text()) for f in files}
    data = root / "input" / "arc-prize-2026"
    data.mkdir(parents=True)
    (data / "arc-agi_evaluation_challenges.json").write_text(json.dumps(
        {t: {"train": v["train"], "test": [{"input": p["input"]} for p in v["test"]]} for t, v in tasks.items()}))
    (data / "arc-agi_evaluation_solutions.json").write_text(json.dumps(
        {t: [p["output"] for p in v["test"]] for t, v in tasks.items()}))
    (root / "bundle").mkdir()
    (root / "bundle" / "kit").symlink_to(REPO)
    return root, sorted(tasks)


def rehearsal_args(root: Path, name: str, tasks: int, deadline: float) -> argparse.Namespace:
    return argparse.Namespace(input=root / "input", bundle=root / "bundle", out_dir=root / name,
                              started=time.time(), rehearsal_tasks=tasks, rehearsal_deadline=deadline,
                              rehearsal_full=False, competition="arc-prize-2026")


@pytest.mark.timeout(900)
def test_the_rehearsal_makes_writes_and_scores_an_attempt_per_task(kaggle_input, tmp_path, capfd):
    pytest.importorskip("torch", reason="the tiny model needs the engine environment")
    from build.models.tiny import make_checkpoint

    root, ids = kaggle_input
    model = make_checkpoint(tmp_path / "tiny", "qwen3", seed=0)
    # cpu-tiny's full schedule (300 s, 20/40 s margins) scaled to 600 s, as the commit run scales moe-4xL4's 12 h to
    # 30 min; boot ends it once both tasks have a finished attempt (random weights write grids of up to 1,830 tokens
    # and the hf engine decodes in static batches: at load 12 on 2 cores one batch took up to 400 s, and the whole
    # schedule would fill the deadline).
    args = rehearsal_args(root, "out-ok", tasks=2, deadline=600.0)
    args.out_dir.mkdir()
    assert boot.rehearse(args, "cpu-tiny", model, dict(os.environ, **boot.OFFLINE)) == 0
    out = capfd.readouterr().out
    assert "every task has a finished attempt: ending the solver now" in out
    assert "aborted at SIGTERM" in out  # the solver's own summary: ended by boot, not by its deadline
    assert "rehearsal ok: every one of 2 tasks" in out and "score: task-weighted" in out
    records = [json.loads(line) for line in (args.out_dir / "rehearsal" / "attempts.jsonl").read_text().splitlines()]
    assert {r["task_id"] for r in records if not r["aborted"]} == set(ids[:2])
    answers = json.loads((args.out_dir / "rehearsal" / "submission.json").read_text())
    assert sorted(answers) == ids[:2]
    made = {r["task_id"] for r in records if r["grid"] is not None}
    assert made and all(answers[t][0]["attempt_1"] != [[0]] for t in made)  # written, not overwritten with [[0]]


def test_the_rehearsal_fails_loudly_when_the_engine_does_not_start(kaggle_input, tmp_path):
    root, _ = kaggle_input
    broken = tmp_path / "broken-model"
    broken.mkdir()
    (broken / "config.json").write_text("{}")
    args = rehearsal_args(root, "out-broken", tasks=2, deadline=60.0)
    args.out_dir.mkdir()
    with pytest.raises(boot.BootError, match="the solver exited with status [1-9].*did the engine start.*no attempt "
                                             "finished on any of the 2 rehearsal tasks"):
        boot.rehearse(args, "cpu-tiny", broken, dict(os.environ, **boot.OFFLINE))
