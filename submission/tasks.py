"""ARC tasks: loading the three layouts competitors meet, with validation that never stops the other tasks.

Layouts: (a) a directory of per-task JSON files (`<task_id>.json`, as in the ARC repositories), (b) one such file,
(c) Kaggle's combined `arc-agi_*_challenges.json` (`{task_id: {"train": [...], "test": [{"input": g}, ...]}}`) with an
optional solutions file (`{task_id: [grid, ...]}`) or directory of task files holding test outputs.

A bad task becomes a `TaskError` naming the file, the task id and the field; it keeps its test-input count where that
can be read, so the answer file still gets a complete `[[0]]` entry for it. Bad labels raise instead: labels are only
used offline (scoring, training), where a silent gap would corrupt a number.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from submission.grids import Grid, GridError, to_grid


@dataclass(frozen=True)
class Pair:
    input: Grid
    output: Grid


@dataclass(frozen=True)
class Task:
    """One task: demonstrations, test inputs, and the test outputs when they are known (labels)."""

    id: str
    train: tuple[Pair, ...]
    test_inputs: tuple[Grid, ...]
    test_outputs: tuple[Grid, ...] | None = None


@dataclass(frozen=True)
class TaskError:
    """A task that could not be used; `test_count` is how many `[[0]]` answers it still gets."""

    source: str
    task_id: str
    field: str
    message: str
    test_count: int

    def __str__(self) -> str:
        return f"{self.source}: task {self.task_id}: {self.field}: {self.message}"


@dataclass(frozen=True)
class TaskSet:
    tasks: tuple[Task, ...]
    errors: tuple[TaskError, ...]

    def test_counts(self) -> dict[str, int]:
        """Every task id (good or bad) with its number of test inputs: the shape of a complete answer file."""
        counts = {t.id: len(t.test_inputs) for t in self.tasks}
        counts.update({e.task_id: e.test_count for e in self.errors})
        return dict(sorted(counts.items()))

    def first(self, n: int) -> "TaskSet":
        """The first n good tasks and the bad ones that sort before the last of them (`--max-tasks`)."""
        kept = self.tasks[:n]
        return TaskSet(kept, tuple(e for e in self.errors if e.task_id < (kept[-1].id if kept else "")))


class LoadError(ValueError):
    """A file that cannot be read at all (or bad labels); the message names the file and the field."""


class _FieldError(Exception):
    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field


def _grid(value: Any, field: str) -> Grid:
    try:
        return to_grid(value)
    except GridError as err:
        raise _FieldError(field, str(err)) from None


def _test_count(raw: Any) -> int:
    tests = raw.get("test") if isinstance(raw, dict) else None
    return len(tests) if isinstance(tests, list) and tests else 1


def parse_task(task_id: str, raw: Any) -> Task:
    """Validate one task's JSON value; raise _FieldError naming the first bad field."""
    if not isinstance(raw, dict):
        raise _FieldError("task", f"is a {type(raw).__name__}, not an object")
    train_raw, test_raw = raw.get("train"), raw.get("test")
    if not isinstance(train_raw, list) or not train_raw:
        raise _FieldError("train", "needs at least one demonstration pair")
    if not isinstance(test_raw, list) or not test_raw:
        raise _FieldError("test", "needs at least one test input")
    train = []
    for i, pair in enumerate(train_raw):
        if not isinstance(pair, dict) or "input" not in pair or "output" not in pair:
            raise _FieldError(f"train[{i}]", "needs 'input' and 'output'")
        train.append(Pair(_grid(pair["input"], f"train[{i}].input"), _grid(pair["output"], f"train[{i}].output")))
    inputs, outputs = [], []
    for i, pair in enumerate(test_raw):
        if not isinstance(pair, dict) or "input" not in pair:
            raise _FieldError(f"test[{i}]", "needs 'input'")
        inputs.append(_grid(pair["input"], f"test[{i}].input"))
        if "output" in pair:
            outputs.append(_grid(pair["output"], f"test[{i}].output"))
    labels = tuple(outputs) if len(outputs) == len(inputs) else None
    return Task(task_id, tuple(train), tuple(inputs), labels)


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise LoadError(f"{path}: cannot read JSON: {err}") from None


def _parse_many(source: str, raw_tasks: dict[str, Any]) -> tuple[list[Task], list[TaskError]]:
    tasks, errors = [], []
    for task_id, raw in raw_tasks.items():
        try:
            tasks.append(parse_task(task_id, raw))
        except _FieldError as err:
            errors.append(TaskError(source, task_id, err.field, str(err), _test_count(raw)))
    return tasks, errors


def _is_single_task(raw: Any) -> bool:
    return isinstance(raw, dict) and "train" in raw and "test" in raw


def load_tasks(path: str | Path, solutions: str | Path | None = None) -> TaskSet:
    """Load a directory of task files, one task file, or a Kaggle combined challenges file (see module doc)."""
    path = Path(path)
    tasks: list[Task] = []
    errors: list[TaskError] = []
    if path.is_dir():
        for file in sorted(path.glob("*.json")):
            try:
                raw = _read_json(file)
            except LoadError as err:
                errors.append(TaskError(str(file), file.stem, "file", str(err).split(": ", 1)[1], 1))
                continue
            found, bad = _parse_many(str(file), {file.stem: raw})
            tasks += found
            errors += bad
    elif path.is_file():
        raw = _read_json(path)
        if _is_single_task(raw):
            tasks, errors = _parse_many(str(path), {path.stem: raw})
        elif isinstance(raw, dict):
            tasks, errors = _parse_many(str(path), raw)
        else:
            raise LoadError(f"{path}: top level is a {type(raw).__name__}, not a task or an object of tasks")
    else:
        raise LoadError(f"{path}: no such file or directory")
    if not tasks and not errors:
        raise LoadError(f"{path}: holds no tasks")
    if solutions is not None:
        tasks = attach_labels(tasks, load_labels(solutions))
    return TaskSet(tuple(sorted(tasks, key=lambda t: t.id)), tuple(sorted(errors, key=lambda e: e.task_id)))


def load_labels(path: str | Path) -> dict[str, tuple[Grid, ...]]:
    """Test outputs by task id, from a Kaggle solutions file, a directory of task files, or one task file."""
    path = Path(path)
    labels: dict[str, tuple[Grid, ...]] = {}
    if path.is_dir():
        for file in sorted(path.glob("*.json")):
            labels[file.stem] = _labels_of_task(file, file.stem, _read_json(file))
        return labels
    raw = _read_json(path)
    if _is_single_task(raw):
        return {path.stem: _labels_of_task(path, path.stem, raw)}
    if not isinstance(raw, dict):
        raise LoadError(f"{path}: top level is a {type(raw).__name__}, not an object of task ids")
    for task_id, grids in raw.items():
        if not isinstance(grids, list) or not grids:
            raise LoadError(f"{path}: task {task_id}: solutions: not a non-empty list of grids")
        try:
            labels[task_id] = tuple(_grid(g, f"solutions[{i}]") for i, g in enumerate(grids))
        except _FieldError as err:
            raise LoadError(f"{path}: task {task_id}: {err.field}: {err}") from None
    return labels


def _labels_of_task(file: Path, task_id: str, raw: Any) -> tuple[Grid, ...]:
    tests = raw.get("test") if isinstance(raw, dict) else None
    if not isinstance(tests, list) or not tests:
        raise LoadError(f"{file}: task {task_id}: test: no test pairs")
    out = []
    for i, pair in enumerate(tests):
        if not isinstance(pair, dict) or "output" not in pair:
            raise LoadError(f"{file}: task {task_id}: test[{i}].output: missing")
        try:
            out.append(_grid(pair["output"], f"test[{i}].output"))
        except _FieldError as err:
            raise LoadError(f"{file}: task {task_id}: {err.field}: {err}") from None
    return tuple(out)


def attach_labels(tasks: list[Task], labels: dict[str, tuple[Grid, ...]]) -> list[Task]:
    """Tasks with their labels; a label list whose length disagrees with the test inputs is an error."""
    out = []
    for task in tasks:
        grids = labels.get(task.id)
        if grids is not None and len(grids) != len(task.test_inputs):
            raise LoadError(f"solutions: task {task.id}: {len(grids)} outputs for {len(task.test_inputs)} test inputs")
        out.append(Task(task.id, task.train, task.test_inputs, grids if grids is not None else task.test_outputs))
    return out
