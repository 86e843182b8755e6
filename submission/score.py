"""Score a submission against known test outputs.

    python -m submission.score --submission submission.json --solutions DIR_OR_FILE [--json]

Task-weighted score (the competition's): mean over tasks of the fraction of test inputs right by either attempt, x100.
Input-weighted score: right test inputs / all test inputs, x100. Tasks in the solutions but missing from the submission
count as wrong and are listed; tasks only in the submission are ignored and listed. `--json` prints per-task detail.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from submission.grids import Grid, GridError, to_grid
from submission.tasks import LoadError, load_labels


@dataclass(frozen=True)
class TaskScore:
    task_id: str
    right: tuple[bool, ...]  # per test input: either attempt equals the label
    problems: tuple[str, ...]  # malformed or missing entries, for the report

    @property
    def fraction(self) -> float:
        return sum(self.right) / len(self.right)


@dataclass(frozen=True)
class ScoreReport:
    task_weighted: float
    input_weighted: float
    tasks: tuple[TaskScore, ...]
    missing_tasks: tuple[str, ...]
    extra_tasks: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["tasks"] = {t.task_id: {"right": list(t.right), "fraction": t.fraction, "problems": list(t.problems)}
                        for t in self.tasks}
        return out


def _attempts(entry: Any, index: int) -> tuple[list[Grid], list[str]]:
    grids, problems = [], []
    if not isinstance(entry, dict):
        return grids, [f"test {index}: entry is a {type(entry).__name__}, not an object"]
    for key in ("attempt_1", "attempt_2"):
        if key not in entry:
            problems.append(f"test {index}: {key} missing")
            continue
        try:
            grids.append(to_grid(entry[key]))
        except GridError as err:
            problems.append(f"test {index}: {key}: {err}")
    return grids, problems


def score_task(task_id: str, entries: Any, labels: tuple[Grid, ...]) -> TaskScore:
    if not isinstance(entries, list):
        return TaskScore(task_id, (False,) * len(labels), ("missing" if entries is None else "not a list",))
    right, problems = [], []
    if len(entries) != len(labels):
        problems.append(f"{len(entries)} entries for {len(labels)} test inputs")
    for index, label in enumerate(labels):
        grids, bad = _attempts(entries[index], index) if index < len(entries) else ([], [])
        problems += bad
        right.append(label in grids)
    return TaskScore(task_id, tuple(right), tuple(problems))


def score(submission: dict[str, Any], labels: dict[str, tuple[Grid, ...]]) -> ScoreReport:
    """Score a parsed submission against labels (task id -> test outputs). Pure."""
    if not labels:
        raise ValueError("no labelled tasks to score against")
    tasks = tuple(score_task(tid, submission.get(tid), labels[tid]) for tid in sorted(labels))
    n_inputs = sum(len(t.right) for t in tasks)
    return ScoreReport(
        task_weighted=100 * sum(t.fraction for t in tasks) / len(tasks),
        input_weighted=100 * sum(sum(t.right) for t in tasks) / n_inputs,
        tasks=tasks,
        missing_tasks=tuple(sorted(set(labels) - set(submission))),
        extra_tasks=tuple(sorted(set(submission) - set(labels))),
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m submission.score", description=__doc__.split("\n\n")[0])
    parser.add_argument("--submission", required=True, type=Path, help="submission.json to score")
    parser.add_argument("--solutions", required=True, type=Path,
                        help="Kaggle solutions file, a directory of task files with test outputs, or one task file")
    parser.add_argument("--json", action="store_true", help="print the full report as JSON")
    args = parser.parse_args(argv)
    try:
        submission = json.loads(args.submission.read_text())
        labels = load_labels(args.solutions)
    except (OSError, json.JSONDecodeError) as err:
        print(f"error: {args.submission}: {err}", file=sys.stderr)
        return 2
    except LoadError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not isinstance(submission, dict):
        print(f"error: {args.submission}: top level is not an object of task ids", file=sys.stderr)
        return 2
    report = score(submission, labels)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
        return 0
    solved = sum(t.fraction == 1 for t in report.tasks)
    print(f"task-weighted score:  {report.task_weighted:6.2f}  ({len(report.tasks)} tasks, {solved} fully solved)")
    print(f"input-weighted score: {report.input_weighted:6.2f}  ({sum(len(t.right) for t in report.tasks)} test inputs)")
    if report.missing_tasks:
        print(f"missing from the submission: {len(report.missing_tasks)} tasks, e.g. {report.missing_tasks[:3]}")
    if report.extra_tasks:
        print(f"not in the solutions (ignored): {len(report.extra_tasks)} tasks")
    problems = sum(len(t.problems) for t in report.tasks if t.task_id not in report.missing_tasks)
    if problems:
        print(f"malformed entries: {problems} (see --json)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
