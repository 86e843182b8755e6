"""The scorer on the real ARC-AGI-2 evaluation set."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from submission.answer_file import render_submission
from submission.grids import EMPTY_ANSWER
from submission.score import score
from submission.tasks import load_labels, load_tasks

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def evaluation(arc_data):
    return load_tasks(arc_data / "arc-agi-2" / "evaluation")


def perfect(tasks) -> dict:
    return render_submission(tasks.test_counts(), {(t.id, i): (EMPTY_ANSWER, g) for t in tasks.tasks
                                                    for i, g in enumerate(t.test_outputs)})


def test_true_outputs_score_100(evaluation, arc_data):
    report = score(perfect(evaluation), load_labels(arc_data / "arc-agi-2" / "evaluation"))
    assert report.task_weighted == 100 and report.input_weighted == 100 and len(report.tasks) == 120


def test_empty_submission_scores_0(evaluation, arc_data):
    empty = render_submission(evaluation.test_counts(), {})
    assert score(empty, load_labels(arc_data / "arc-agi-2" / "evaluation")).task_weighted == 0


def test_task_and_input_weighting_differ_as_they_should(evaluation, arc_data):
    labels = load_labels(arc_data / "arc-agi-2" / "evaluation")
    multi = next(t for t in evaluation.tasks if len(t.test_inputs) == 2)
    single = next(t for t in evaluation.tasks if len(t.test_inputs) == 1)
    sub = render_submission(evaluation.test_counts(),
                            {(multi.id, 0): (multi.test_outputs[0], EMPTY_ANSWER),
                             (single.id, 0): (EMPTY_ANSWER, single.test_outputs[0])})
    report = score(sub, labels)
    assert report.task_weighted == pytest.approx(100 * 1.5 / 120)
    assert report.input_weighted == pytest.approx(100 * 2 / 167)


def test_missing_and_malformed_entries_count_as_wrong(evaluation, arc_data):
    labels = load_labels(arc_data / "arc-agi-2" / "evaluation")
    sub = perfect(evaluation)
    first, second = sorted(sub)[:2]
    del sub[first]
    sub[second] = [{"attempt_1": "oops"}] * len(sub[second])
    sub["not-a-task"] = []
    report = score(sub, labels)
    assert report.missing_tasks == (first,) and report.extra_tasks == ("not-a-task",)
    assert report.task_weighted == pytest.approx(100 * 118 / 120)
    assert any("attempt_2 missing" in p for p in report.tasks[1].problems)


def test_cli_on_kaggle_solutions_file(evaluation, tmp_path):
    sub = perfect(evaluation)
    sub[sorted(sub)[0]] = [{"attempt_1": [[0]], "attempt_2": [[0]]}] * len(sub[sorted(sub)[0]])
    (tmp_path / "submission.json").write_text(json.dumps(sub))
    (tmp_path / "solutions.json").write_text(json.dumps(
        {t.id: [[list(r) for r in g] for g in t.test_outputs] for t in evaluation.tasks}))
    cmd = [sys.executable, "-m", "submission.score", "--submission", str(tmp_path / "submission.json"),
           "--solutions", str(tmp_path / "solutions.json")]
    text = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=True).stdout
    assert "task-weighted score:   99.17" in text
    detail = json.loads(subprocess.run(cmd + ["--json"], cwd=REPO, capture_output=True, text=True, check=True).stdout)
    assert detail["tasks"][sorted(sub)[0]]["fraction"] == 0


def test_cli_names_the_bad_file(tmp_path):
    (tmp_path / "submission.json").write_text("{}")
    (tmp_path / "solutions.json").write_text("[1, 2]")
    proc = subprocess.run([sys.executable, "-m", "submission.score", "--submission", str(tmp_path / "submission.json"),
                           "--solutions", str(tmp_path / "solutions.json")], cwd=REPO, capture_output=True, text=True)
    assert proc.returncode == 2 and "solutions.json" in proc.stderr
