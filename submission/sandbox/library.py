"""Run a library of candidate programs over tasks: sandbox checks, selection, the answer file, and the score.

    python -m submission.sandbox.library --tasks PATH --programs DIR --out submission.json [--solutions PATH]
                                         [--workers 2] [--pair-by-name] [--cpu-s 10] [--wall-s 15] [--memory-mb 1024]
                                         [--json REPORT.json]

Every `*.py` file in DIR defining `transform(grid)` is checked on every task (all demonstrations and test inputs, in
the sandbox), or with `--pair-by-name` only on the task of the same id (`ID.py` on task `ID`: a library of found
programs). The test outputs of train-perfect programs become candidates and SPEC section 4 picks the two attempts.
The answer file is complete from the start and rewritten after every task. The run prints a table of check outcomes
(right: train-perfect; wrong; timeout; error, invalid output included; crash) and which program solved which task
(train-perfect, and right on the test inputs where labels exist); `--json` writes the same. With labels
(`--solutions`, or task files that hold test outputs) the run ends with its score. This is the core of the kit end to
end without a model: teams use it for a hand-written or previously found program library; `make demo` runs it on the
shipped examples.
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from submission.answer_file import AnswerFile, render_submission
from submission.grids import Grid
from submission.sandbox.client import CheckResult, Sandbox, SandboxLimits, Status, exit_quietly_on_closed_pipe
from submission.score import score
from submission.selection import Candidate, Source, select
from submission.tasks import LoadError, Task, load_tasks


OUTCOMES = ("right", "wrong", "timeout", "error", "crash")


@dataclass(frozen=True)
class TaskOutcome:
    task_id: str
    perfect_programs: tuple[str, ...]
    attempts: tuple[tuple[Grid, Grid], ...]  # per test input
    checks: int
    outcomes: tuple[tuple[str, str], ...] = ()  # (program, check outcome) per check
    solved_by: tuple[str, ...] = ()  # train-perfect programs right on every labelled test input


def check_outcome(result: CheckResult) -> str:
    """One word per check: right (train-perfect), else the worst thing that happened on a demonstration: crash,
    timeout, error (an invalid output counts as an error), wrong. Pure."""
    if result.train_perfect:
        return "right"
    statuses = {p.status for p in result.train}
    for status, word in ((Status.CRASH, "crash"), (Status.TIMEOUT, "timeout"), (Status.ERROR, "error"),
                         (Status.INVALID, "error")):
        if status in statuses:
            return word
    return "wrong"


def pair_programs(task_ids: list[str], programs: dict[str, str], by_name: bool) -> dict[str, dict[str, str]]:
    """The programs each task is checked with: all of them, or with `by_name` the one named like the task. Pure."""
    if not by_name:
        return {task_id: programs for task_id in task_ids}
    return {task_id: {task_id: programs[task_id]} if task_id in programs else {} for task_id in task_ids}


def candidates_for(task: Task, results: list[tuple[str, tuple[Grid | None, ...]]]) -> list[list[Candidate]]:
    """Per test input, the candidates of the train-perfect programs (name, test outputs) in library order. Pure."""
    per_input: list[list[Candidate]] = [[] for _ in task.test_inputs]
    for _, outputs in results:
        for index, grid in enumerate(outputs):
            if grid is not None:
                per_input[index].append(Candidate(grid, Source.PROGRAM))
    return per_input


def solve_task(box: Sandbox, task: Task, programs: dict[str, str]) -> TaskOutcome:
    perfect, outcomes, solved_by = [], [], []
    for name, source in programs.items():
        result = box.check(source, task)
        outcomes.append((name, check_outcome(result)))
        if result.train_perfect:
            perfect.append((name, result.test_outputs))
            if task.test_outputs is not None and all(p.status is Status.RIGHT for p in result.test):
                solved_by.append(name)
    attempts = tuple(select(c) for c in candidates_for(task, perfect))
    return TaskOutcome(task.id, tuple(n for n, _ in perfect), attempts, len(programs), tuple(outcomes),
                       tuple(solved_by))


def outcome_report(outcomes: list[TaskOutcome]) -> dict:
    """The run's check outcomes as JSON-ready data: counts, and per task its train-perfect and solving programs."""
    counts = Counter(word for o in outcomes for _, word in o.outcomes)
    return {"checks": {word: counts[word] for word in OUTCOMES},
            "tasks": {o.task_id: {"train_perfect": list(o.perfect_programs), "solved_by": list(o.solved_by)}
                      for o in sorted(outcomes, key=lambda o: o.task_id) if o.perfect_programs}}


def print_report(data: dict, console: Console) -> None:
    counts = Table(title="check outcomes")
    for word in OUTCOMES:
        counts.add_column(word, justify="right")
    counts.add_row(*(str(data["checks"][word]) for word in OUTCOMES))
    console.print(counts)
    if data["tasks"]:
        tasks = Table(title="tasks with a train-perfect program")
        for column in ("task", "train-perfect programs", "right on the test inputs"):
            tasks.add_column(column)
        for task_id, row in data["tasks"].items():
            tasks.add_row(task_id, " ".join(row["train_perfect"]), " ".join(row["solved_by"]) or "-")
        console.print(tasks)


def load_programs(folder: Path) -> dict[str, str]:
    files = sorted(folder.glob("*.py"))
    if not files:
        raise LoadError(f"{folder}: no *.py programs")
    return {f.stem: f.read_text() for f in files}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m submission.sandbox.library", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", required=True, type=Path, help="task directory, task file or Kaggle challenges")
    parser.add_argument("--programs", required=True, type=Path, help="folder of *.py files defining transform(grid)")
    parser.add_argument("--out", required=True, type=Path, help="the answer file to write")
    parser.add_argument("--solutions", type=Path, help="labels for scoring (Kaggle solutions file or task directory)")
    parser.add_argument("--workers", type=int, default=2, help="sandbox servers checking in parallel")
    parser.add_argument("--pair-by-name", action="store_true", help="program ID.py runs on task ID only")
    parser.add_argument("--cpu-s", type=int, default=SandboxLimits.cpu_s, help="CPU seconds per check")
    parser.add_argument("--wall-s", type=float, default=SandboxLimits.wall_s,
                        help="wall seconds per check, not counting time waiting for a CPU")
    parser.add_argument("--memory-mb", type=int, default=SandboxLimits.memory_mb, help="address space per check")
    parser.add_argument("--json", type=Path, help="write the check outcomes and solved tasks here")
    args = parser.parse_args(argv)
    try:
        limits = SandboxLimits(args.cpu_s, args.memory_mb, args.wall_s,
                               backstop_s=max(SandboxLimits.backstop_s, 4 * args.wall_s))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    try:
        tasks = load_tasks(args.tasks, args.solutions)
        programs = load_programs(args.programs)
    except LoadError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    for error in tasks.errors:
        print(f"skipped (answered [[0]]): {error}", file=sys.stderr)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    answers = AnswerFile(args.out, tasks.test_counts())
    paired = pair_programs([t.id for t in tasks.tasks], programs, args.pair_by_name)
    local = threading.local()
    boxes: list[Sandbox] = []

    def work(task: Task) -> TaskOutcome:
        if not hasattr(local, "box"):
            local.box = Sandbox(limits)
            boxes.append(local.box)
        return solve_task(local.box, task, paired[task.id])

    solved: list[TaskOutcome] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    console = Console()
    try:
        with Progress(*columns, console=console, transient=False) as progress, ThreadPoolExecutor(args.workers) as pool:
            checks = sum(len(p) for p in paired.values())
            bar = progress.add_task(f"{checks} checks on {len(tasks.tasks)} tasks", total=len(tasks.tasks))
            futures = {pool.submit(work, t): t for t in tasks.tasks}
            for future in as_completed(futures):
                try:
                    outcome = future.result()
                except Exception as err:  # noqa: BLE001 - a sandbox that cannot start: the task keeps [[0]]
                    print(f"{futures[future].id}: not checked ({type(err).__name__}: {err})", file=sys.stderr)
                    continue
                for index, pair in enumerate(outcome.attempts):
                    answers.update(outcome.task_id, index, pair)
                solved.append(outcome)
                progress.advance(bar)
    finally:
        for box in boxes:
            box.close()
    data = outcome_report(solved)
    print_report(data, console)
    if args.json:
        args.json.write_text(json.dumps(data, indent=1) + "\n")
    with_program = [o for o in solved if o.perfect_programs]
    print(f"checks: {sum(o.checks for o in solved)}; tasks with a train-perfect program: {len(with_program)} "
          f"of {len(tasks.tasks)} (+{len(tasks.errors)} unreadable); answer file: {args.out}")
    labels = {t.id: t.test_outputs for t in tasks.tasks if t.test_outputs is not None}
    if labels:
        report = score(render_submission(answers.test_counts, answers.answers), labels)
        print(f"task-weighted score: {report.task_weighted:.2f}   input-weighted: {report.input_weighted:.2f}   "
              f"({sum(t.fraction == 1 for t in report.tasks)} of {len(report.tasks)} labelled tasks fully solved)")
    return 0


if __name__ == "__main__":
    sys.exit(exit_quietly_on_closed_pipe(main))
