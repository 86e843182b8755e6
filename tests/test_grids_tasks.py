"""Grid validation and task loading: every layout, and bad tasks that name file, task and field without stopping others."""

from __future__ import annotations

import json

import numpy as np
import pytest

from submission.grids import GridError, from_cells, to_cells, to_grid
from submission.tasks import LoadError, load_labels, load_tasks


@pytest.mark.parametrize("value, why", [
    ([], "0 rows"),
    ([[]], "0 cells"),
    ([[1, 2], [3]], "ragged"),
    ([[1] * 31], "31 cells"),
    ([[1]] * 31, "31 rows"),
    ([[10]], "outside 0..9"),
    ([[-1]], "outside 0..9"),
    ([[1.5]], "not an integer"),
    ([[float("nan")]], "not an integer"),
    ([[True]], "boolean"),
    ([["1"]], "str"),
    ("[[1]]", "str"),
    (np.zeros((2, 2, 2)), "3 dimensions"),
    (np.zeros((40, 40)), "exceeds"),
])
def test_bad_grids_say_why(value, why):
    with pytest.raises(GridError, match=why):
        to_grid(value)


def test_good_grids_normalise_to_int_tuples():
    assert to_grid([[1, 2], [3, 4]]) == ((1, 2), (3, 4))
    assert to_grid(np.array([[1, 2]], dtype=np.int8)) == ((1, 2),)
    assert to_grid(np.array([[1.0, 2.0]])) == ((1, 2),)
    assert to_grid([[0] * 30] * 30) == tuple((0,) * 30 for _ in range(30))


def test_wire_form_round_trips_every_real_grid(arc_data):
    """The sandbox carries grids as digit rows joined by "/": exact for every grid of ARC-AGI-2 training."""
    grids = [g for t in load_tasks(arc_data / "arc-agi-2" / "training").tasks
             for g in [*(x for p in t.train for x in (p.input, p.output)), *t.test_inputs, *(t.test_outputs or ())]]
    assert len(grids) > 8000
    assert all(from_cells(to_cells(g)) == g for g in grids)
    assert to_cells(((0, 1), (2, 3))) == "01/23"


@pytest.mark.parametrize("text", ["", "1/", "/1", "12/3", "1a", "12/3x", "1" * 31, "/".join(["1"] * 31), "1//1",
                                  "١٢", None, 12, "12\n"])
def test_malformed_wire_form_is_refused(text):
    with pytest.raises(GridError):
        from_cells(text)


def test_loads_real_evaluation_directory(arc_data):
    tasks = load_tasks(arc_data / "arc-agi-2" / "evaluation")
    assert len(tasks.tasks) == 120 and not tasks.errors
    assert sum(len(t.test_inputs) for t in tasks.tasks) == 167  # the count documented with the data
    assert all(t.test_outputs is not None for t in tasks.tasks)


def test_kaggle_combined_files_round_trip(arc_data, tmp_path):
    source = arc_data / "arc-agi-2" / "evaluation"
    challenges, solutions = {}, {}
    for file in sorted(source.glob("*.json"))[:15]:
        raw = json.loads(file.read_text())
        challenges[file.stem] = {"train": raw["train"], "test": [{"input": p["input"]} for p in raw["test"]]}
        solutions[file.stem] = [p["output"] for p in raw["test"]]
    (tmp_path / "arc-agi_test_challenges.json").write_text(json.dumps(challenges))
    (tmp_path / "solutions.json").write_text(json.dumps(solutions))
    bare = load_tasks(tmp_path / "arc-agi_test_challenges.json")
    assert len(bare.tasks) == 15 and all(t.test_outputs is None for t in bare.tasks)
    labelled = load_tasks(tmp_path / "arc-agi_test_challenges.json", tmp_path / "solutions.json")
    direct = {t.id: t for t in load_tasks(source).tasks}
    for task in labelled.tasks:
        assert task == direct[task.id]


def test_single_task_file(arc_data):
    tasks = load_tasks(arc_data / "arc-agi-2" / "training" / "3c9b0459.json")
    assert [t.id for t in tasks.tasks] == ["3c9b0459"]


def test_bad_tasks_are_reported_and_do_not_stop_the_others(arc_data, tmp_path):
    good = json.loads((arc_data / "arc-agi-2" / "training" / "3c9b0459.json").read_text())
    combined = {
        "good": good,
        "ragged": {"train": good["train"], "test": [{"input": [[1, 2], [3]]}, {"input": [[1]]}]},
        "colour": {"train": [{"input": [[1]], "output": [[11]]}], "test": [{"input": [[1]]}]},
        "no_train": {"train": [], "test": [{"input": [[1]]}]},
        "no_test": {"train": good["train"], "test": []},
        "not_object": [1, 2, 3],
    }
    path = tmp_path / "challenges.json"
    path.write_text(json.dumps(combined))
    tasks = load_tasks(path)
    assert [t.id for t in tasks.tasks] == ["good"]
    errors = {e.task_id: e for e in tasks.errors}
    assert errors["ragged"].field == "test[0].input" and "ragged" in errors["ragged"].message
    assert errors["ragged"].test_count == 2  # still two [[0]] answers
    assert errors["colour"].field == "train[0].output"
    assert errors["no_train"].field == "train" and errors["no_test"].field == "test"
    assert str(path) in str(errors["colour"]) and "task colour" in str(errors["colour"])
    assert tasks.test_counts() == {"colour": 1, "good": 1, "no_test": 1, "no_train": 1, "not_object": 1, "ragged": 2}


def test_unreadable_file_in_a_directory_is_one_error(arc_data, tmp_path):
    (tmp_path / "broken.json").write_text("{not json")
    (tmp_path / "3c9b0459.json").write_text((arc_data / "arc-agi-2" / "training" / "3c9b0459.json").read_text())
    tasks = load_tasks(tmp_path)
    assert [t.id for t in tasks.tasks] == ["3c9b0459"]
    assert tasks.errors[0].task_id == "broken" and tasks.errors[0].field == "file"


def test_bad_labels_raise_naming_file_and_field(tmp_path):
    (tmp_path / "sol.json").write_text(json.dumps({"t1": [[[1, 2], [3]]]}))
    with pytest.raises(LoadError, match=r"sol.json: task t1: solutions\[0\]: .*ragged"):
        load_labels(tmp_path / "sol.json")
    with pytest.raises(LoadError, match="no such file"):
        load_tasks(tmp_path / "missing.json")


def test_first_tasks_keep_the_bad_ones_among_them(arc_data):
    """`--max-tasks N`: the first N good tasks and the unreadable ones that sort before the last of them."""
    from submission.tasks import TaskError, TaskSet

    good = load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks[:3]
    bad = tuple(TaskError("x.json", tid, "train", "bad", 1) for tid in ("0", good[1].id + "0", "zzzzzzzz"))
    first = TaskSet(good, bad).first(2)
    assert first.tasks == good[:2] and [e.task_id for e in first.errors] == ["0"]
    assert TaskSet(good, bad).first(0) == TaskSet((), ())
