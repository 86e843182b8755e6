"""Hand-written programs for real ARC tasks through the sandbox: right ones are train-perfect and right on the test
inputs; plausible wrong ones are caught on a demonstration."""

from __future__ import annotations

from pathlib import Path

import pytest

from submission.sandbox.client import Sandbox, Status
from submission.tasks import load_tasks

RIGHT = sorted((Path(__file__).parents[1] / "examples" / "programs").glob("*.py"))  # also the demo's library
WRONG = sorted((Path(__file__).parent / "wrong_programs").glob("*.py"))


@pytest.fixture(scope="module")
def box():
    with Sandbox() as sandbox:
        yield sandbox


def real_task(arc_data, task_id):
    return load_tasks(arc_data / "arc-agi-2" / "training" / f"{task_id}.json").tasks[0]


def test_enough_programs():
    assert len(RIGHT) >= 10 and len(WRONG) >= 5


@pytest.mark.parametrize("program", RIGHT, ids=[p.stem for p in RIGHT])
def test_right_program_is_train_perfect_and_right_on_test(program, box, arc_data):
    result = box.check(program.read_text(), real_task(arc_data, program.stem))
    assert result.train_perfect, [(p.status, p.message) for p in result.train]
    assert all(p.status is Status.RIGHT for p in result.test)


@pytest.mark.parametrize("program", WRONG, ids=[p.stem for p in WRONG])
def test_wrong_program_is_caught_on_a_demonstration(program, box, arc_data):
    result = box.check(program.read_text(), real_task(arc_data, program.stem))
    assert not result.train_perfect
    assert any(p.status is Status.WRONG for p in result.train)


def test_unlabelled_test_inputs_are_produced_not_judged(box, arc_data):
    task = real_task(arc_data, "3c9b0459")
    hidden = type(task)(task.id, task.train, task.test_inputs, None)
    result = box.check(next(p for p in RIGHT if p.stem == "3c9b0459").read_text(), hidden)
    assert result.test[0].status is Status.PRODUCED and result.test[0].output == task.test_outputs[0]


def test_cli_prints_a_json_report(arc_data):
    import json
    import subprocess
    import sys

    program = next(p for p in RIGHT if p.stem == "74dd1130")
    out = subprocess.run([sys.executable, "-m", "submission.sandbox.client", "--program", str(program), "--task",
                          str(arc_data / "arc-agi-2" / "training" / "74dd1130.json")],
                         cwd=Path(__file__).parents[1], capture_output=True, text=True, check=True).stdout
    report = json.loads(out)
    assert report["train_perfect"] and report["test"][0]["status"] == "right" and "seccomp" in report["layers"]
