"""Run a library of candidate programs over tasks: sandbox checks, selection, the answer file, and the score.

    python -m submission.library --tasks PATH --programs DIR --out submission.json [--solutions PATH] [--workers 2]

Every `*.py` file in DIR defining `transform(grid)` is checked on every task (all demonstrations and test inputs, in
the sandbox); the test outputs of train-perfect programs become candidates and SPEC section 4 picks the two attempts.
The answer file is complete from the start and rewritten after every task. With labels (`--solutions`, or task files
that hold test outputs) the run ends with its score. This is the core of the kit end to end without a model: teams
use it for a hand-written or previously found program library; `make demo` runs it on the shipped examples.
"""

from __future__ import annotations

import argparse
import sys
import threading
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from submission.answers import AnswerFile, render_submission
from submission.grids import Grid
from submission.sandbox import Sandbox, SandboxLimits
from submission.score import score
from submission.selection import Candidate, Source, select
from submission.tasks import LoadError, Task, load_tasks


@dataclass(frozen=True)
class TaskOutcome:
    task_id: str
    perfect_programs: tuple[str, ...]
    attempts: tuple[tuple[Grid, Grid], ...]  # per test input
    checks: int


def candidates_for(task: Task, results: list[tuple[str, tuple[Grid | None, ...]]]) -> list[list[Candidate]]:
    """Per test input, the candidates of the train-perfect programs (name, test outputs) in library order. Pure."""
    per_input: list[list[Candidate]] = [[] for _ in task.test_inputs]
    for _, outputs in results:
        for index, grid in enumerate(outputs):
            if grid is not None:
                per_input[index].append(Candidate(grid, Source.PROGRAM))
    return per_input


def solve_task(box: Sandbox, task: Task, programs: dict[str, str]) -> TaskOutcome:
    perfect = []
    for name, source in programs.items():
        result = box.check(source, task)
        if result.train_perfect:
            perfect.append((name, result.test_outputs))
    attempts = tuple(select(c) for c in candidates_for(task, perfect))
    return TaskOutcome(task.id, tuple(n for n, _ in perfect), attempts, len(programs))


def load_programs(folder: Path) -> dict[str, str]:
    files = sorted(folder.glob("*.py"))
    if not files:
        raise LoadError(f"{folder}: no *.py programs")
    return {f.stem: f.read_text() for f in files}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m submission.library", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", required=True, type=Path, help="task directory, task file or Kaggle challenges")
    parser.add_argument("--programs", required=True, type=Path, help="folder of *.py files defining transform(grid)")
    parser.add_argument("--out", required=True, type=Path, help="the answer file to write")
    parser.add_argument("--solutions", type=Path, help="labels for scoring (Kaggle solutions file or task directory)")
    parser.add_argument("--workers", type=int, default=2, help="sandbox servers checking in parallel")
    args = parser.parse_args(argv)
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
    local = threading.local()
    boxes: list[Sandbox] = []

    def work(task: Task) -> TaskOutcome:
        if not hasattr(local, "box"):
            local.box = Sandbox(SandboxLimits())
            boxes.append(local.box)
        return solve_task(local.box, task, programs)

    solved: list[TaskOutcome] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, transient=False) as progress, ThreadPoolExecutor(args.workers) as pool:
            bar = progress.add_task(f"{len(programs)} programs x {len(tasks.tasks)} tasks", total=len(tasks.tasks))
            for future in as_completed([pool.submit(work, t) for t in tasks.tasks]):
                outcome = future.result()
                for index, pair in enumerate(outcome.attempts):
                    answers.update(outcome.task_id, index, pair)
                solved.append(outcome)
                progress.advance(bar)
    finally:
        for box in boxes:
            box.close()
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
    sys.exit(main())
