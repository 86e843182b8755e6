"""The transfer probe: does a model solve held-out corpus tasks, and how does it do on real ARC tasks in the same run?

    python -m training.corpus probe --corpus runs/corpus --out runs/probe [--real $ARC_DATA/arc-agi-2/evaluation]
        [--profile cpu-tiny] [--model DIR] [--deadline S [--scale-schedule]] [--max-tasks N] [--json PATH]

(also `python -m training.corpus.probe`, where `--panel` is `--real`'s other name.)

It runs the solver (`submission.lines.run_profile`, the library function `submission.main` calls, in this process) once
per panel: `heldout`, the corpus's `heldout/` split (generate's held-out rules, never mixed into training:
training/corpus/mix.py), and `real`, a folder of ARC task files with their test outputs (default:
$ARC_DATA/arc-agi-2/evaluation). `--profile --model --deadline --scale-schedule --max-tasks` go to each run as they are,
so each panel gets the whole deadline. Each panel's answer file, attempt log and profile land in OUT/<panel>/; each is
scored by `submission.score.score` against the test
outputs of the tasks the run took (the first `--max-tasks` by id, as the solver takes them). It prints a table
(panel, tasks, test inputs, right inputs, score) and writes the JSON (default OUT/probe.json) after every panel, so a
run ended early keeps the panels it finished (the solver runs without its watchdog: its hard stop ends each
panel; wrap the command in `timeout` against an engine that hangs). Scores are fractions in [0, 1]: `score` is task-weighted (the
competition's), `input_score` input-weighted. Exit status: 0, or 1 when a solver run did not end normally (its status
is in the JSON).
Both panels are checked (tasks readable, every test output there) before the model starts.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from submission.answer_file import write_atomic
from submission.grids import Grid
from submission.score import score
from submission.tasks import LoadError, load_tasks

DEFAULT_PANEL = Path(os.environ.get("ARC_DATA", Path(__file__).resolve().parents[3] / "shared" / "arc-data")) \
    / "arc-agi-2" / "evaluation"
HELDOUT = "heldout"  # generate.SPLIT_DIRS["heldout"]; not imported: that would pull numpy's corpus code in


class ProbeError(ValueError):
    """A panel or output folder the probe cannot use; the message names the folder or file."""


@dataclass(frozen=True)
class PanelResult:
    panel: str  # "heldout" or "real"
    folder: str  # the task files (and their test outputs)
    tasks: int
    test_inputs: int
    right_inputs: int
    score: float  # task-weighted, in [0, 1]
    input_score: float  # input-weighted, in [0, 1]
    status: int  # the solver's exit status (0: ended normally)
    answers: str  # the answer file scored


def panel_labels(folder: Path, max_tasks: int | None) -> dict[str, tuple[Grid, ...]]:
    """Test outputs of the tasks a solver run on `folder` takes (the first `max_tasks` by id, as `--max-tasks`).
    A folder without tasks, or a task without its test outputs, raises ProbeError naming it."""
    try:
        tasks = load_tasks(folder, folder)
    except LoadError as err:
        raise ProbeError(str(err)) from None
    if tasks.errors:
        raise ProbeError(f"{tasks.errors[0]} (the probe scores every task: fix or remove it)")
    taken = tasks.first(max_tasks) if max_tasks else tasks
    return {t.id: t.test_outputs for t in taken.tasks}


def panel_result(panel: str, folder: Path, labels: dict[str, tuple[Grid, ...]], submission: Any, status: int,
                 answers: Path) -> PanelResult:
    """One panel's row from the answer file's content (a missing or unreadable file is {}: every task wrong). Pure.

    >>> grid = ((1,),)
    >>> r = panel_result("real", Path("p"), {"a": (grid,), "b": (grid, grid)},
    ...                  {"a": [{"attempt_1": [[1]], "attempt_2": [[0]]}]}, 0, Path("s.json"))
    >>> r.tasks, r.test_inputs, r.right_inputs, r.score, round(r.input_score, 3)
    (2, 3, 1, 0.5, 0.333)
    """
    report = score(submission if isinstance(submission, dict) else {}, labels)
    return PanelResult(panel, str(folder), len(report.tasks), sum(len(t.right) for t in report.tasks),
                       sum(sum(t.right) for t in report.tasks), report.task_weighted / 100,
                       report.input_weighted / 100, status, str(answers))


def table(results: list[PanelResult]) -> str:
    """The results as a Markdown table.

    >>> print(table([PanelResult("heldout", "c/heldout", 2, 2, 1, 0.5, 0.5, 0, "o/heldout/submission.json")]))
    | panel | tasks | test inputs | right inputs | score | solver status |
    | --- | --- | --- | --- | --- | --- |
    | heldout | 2 | 2 | 1 | 0.500 | 0 |
    """
    rows = ["| panel | tasks | test inputs | right inputs | score | solver status |", "| --- | --- | --- | --- | --- | --- |"]
    rows += [f"| {r.panel} | {r.tasks} | {r.test_inputs} | {r.right_inputs} | {r.score:.3f} | {r.status} |"
             for r in results]
    return "\n".join(rows)


def solver_arguments(args: argparse.Namespace, folder: Path, out: Path) -> argparse.Namespace:
    """The solver's arguments for one panel: the pass-through options as given, the panel as tasks and solutions."""
    from submission.lines import arguments  # the solver's modules load once the panels are checked

    return arguments(folder, out / "submission.json", args.profile, model=args.model, log=out / "attempts.jsonl",
                     deadline=args.deadline, scale_schedule=args.scale_schedule, solutions=folder,
                     max_tasks=args.max_tasks)


def read_answers(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError):
        return {}


def run(args: argparse.Namespace) -> list[PanelResult]:
    panels = {HELDOUT: args.corpus / HELDOUT, "real": args.panel}
    if not any(panels[HELDOUT].glob("*.json")):  # generate's 5% of a family's admitted rules rounds to none below 11
        raise ProbeError(f"{panels[HELDOUT]}: holds no tasks (generate holds out 5% of each family's admitted rules, "
                         "rounded: a family needs >= 11 admitted rules for one)")
    labels = {name: panel_labels(folder, args.max_tasks) for name, folder in panels.items()}
    for name in panels:
        if (args.out / name / "attempts.jsonl").exists():
            raise ProbeError(f"{args.out / name}: holds an earlier probe's attempt log; use a new --out")
    report = {"profile": args.profile, "model": args.model, "deadline": args.deadline,
              "scale_schedule": args.scale_schedule, "max_tasks": args.max_tasks, "panels": {}}
    from submission.lines import run_profile  # the solver's modules load once the panels are checked

    results = []
    for name, folder in panels.items():
        out = args.out / name
        out.mkdir(parents=True, exist_ok=True)
        # no watchdog: with a short deadline it could end this process (and the other panel) between the solver's
        # hard stop and its return; the hard stop bounds the run, a stuck engine is for an outer `timeout`
        status = run_profile(solver_arguments(args, folder, out), watchdog=False)
        if status == 2:  # the solver refused its arguments (it said why): the other panel would be refused too
            raise ProbeError(f"the solver refused the run on {folder} (see its error above)")
        answers = out / "submission.json"
        results.append(panel_result(name, folder, labels[name], read_answers(answers), status, answers))
        report["panels"][name] = asdict(results[-1])
        write_atomic(args.json, (json.dumps(report, indent=2) + "\n").encode())
    return results


def main(argv: list[str] | None = None, prog: str = "python -m training.corpus.probe") -> int:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    parser.add_argument("--corpus", type=Path, required=True, help="a corpus folder (generate's --out)")
    parser.add_argument("--panel", "--real", type=Path, default=DEFAULT_PANEL,
                        help="real ARC task files with test outputs (default: $ARC_DATA/arc-agi-2/evaluation)")
    parser.add_argument("--out", type=Path, required=True, help="answer files and logs, one folder per panel")
    parser.add_argument("--json", type=Path, help="the results (default: OUT/probe.json)")
    parser.add_argument("--profile", default="cpu-tiny", help="the solver's profile (name or TOML path)")
    parser.add_argument("--model", help="checkpoint folder (default: the profile's)")
    parser.add_argument("--deadline", type=float, help="each panel's time limit in seconds")
    parser.add_argument("--scale-schedule", action="store_true", help="scale the schedule to --deadline")
    parser.add_argument("--max-tasks", type=int, help="only the first N tasks of each panel by id")
    args = parser.parse_args(argv)
    if args.max_tasks is not None and args.max_tasks < 1:
        parser.error(f"--max-tasks: must be >= 1, got {args.max_tasks}")
    if not (args.corpus / HELDOUT).is_dir():
        parser.error(f"--corpus: {args.corpus} has no {HELDOUT}/ folder (is it generate's --out?)")
    args.json = args.json or args.out / "probe.json"
    args.json.parent.mkdir(parents=True, exist_ok=True)
    try:
        results = run(args)
    except ProbeError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(table(results))
    print(f"wrote {args.json}")
    return 0 if all(r.status == 0 for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
