"""training/corpus/probe.py: the solver, in process, on a corpus's held-out split and on a real ARC panel, each scored
as submission.score scores the answer file it wrote. The replay engine gives known right and wrong answers (the
scores are known in advance); the tiny random-weight Qwen3 on the hf engine runs the real path (engine environment)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from submission.attempts import AttemptRecord, read_log
from submission.schedule import Level
from submission.score import score
from submission.tasks import load_labels, load_tasks
from training.corpus import dsl, generate, probe, rules
from training.corpus.family_count import CountPack
from training.corpus.family_rays import Rays


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A corpus folder whose heldout/ holds two tasks (generate's file format and names), made by the oracle."""
    root = tmp_path_factory.mktemp("corpus")
    (root / "heldout").mkdir()
    for rule in (Rays("right", "wall", "mark"), CountPack("any", "row", "mark", 8)):
        rng = np.random.default_rng(0)
        pairs = [rules.propose(rule, rng) for _ in range(6)]
        (root / "heldout" / f"{dsl.rule_id(rule)}-0.json").write_text(json.dumps(generate.task_json(pairs)))
    return root


@pytest.fixture(scope="module")
def panel(tmp_path_factory, arc_data) -> Path:
    """The two smallest ARC-AGI-2 evaluation tasks (short prompts for the CPU), with their test outputs."""
    folder = tmp_path_factory.mktemp("panel")
    files = sorted((arc_data / "arc-agi-2" / "evaluation").glob("*.json"), key=lambda f: f.stat().st_size)[:2]
    for file in files:
        shutil.copy(file, folder / file.name)
    return folder


def replay_log(path: Path, folders: list[Path], right: set[str]) -> Path:
    """An earlier run whose three attempts per test input all give the label (tasks in `right`) or a wrong grid."""
    records = []
    for folder in folders:
        for task in load_tasks(folder, folder).tasks:
            for index, label in enumerate(task.test_outputs):
                wrong = ((label[0][0] + 1) % 10,) + label[0][1:], *label[1:]
                for attempt in (1, 2, 3):
                    records.append(AttemptRecord(task.id, index, attempt, Level(attempt - 1), 0, 4000, natural=True,
                                                 thinking_tokens=100, answer_tokens=50,
                                                 grid=label if task.id in right else wrong,
                                                 started_s=0.0, finished_s=0.1))
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    return path


def ids(folder: Path) -> list[str]:
    return sorted(f.stem for f in folder.glob("*.json"))


def check_against_the_answer_files(report: dict, panels: dict[str, Path], tasks: int) -> None:
    assert list(report["panels"]) == list(panels)
    for name, folder in panels.items():
        row = report["panels"][name]
        labels = load_labels(folder)
        labels = {t: labels[t] for t in ids(folder)[:tasks]}
        expected = score(json.loads(Path(row["answers"]).read_text()), labels)
        assert row["tasks"] == tasks and row["test_inputs"] == sum(map(len, labels.values()))
        assert 0 <= row["score"] <= 1 and row["score"] == expected.task_weighted / 100, name
        assert row["input_score"] == expected.input_weighted / 100, name
        assert row["status"] == 0


def test_both_panels_are_scored_as_submission_score_scores_the_answer_files(corpus, panel, replay_profile, tmp_path,
                                                                           capsys):
    right = {ids(corpus / "heldout")[0], ids(panel)[1]}
    profile = replay_profile(tmp_path, replay_log(tmp_path / "earlier.jsonl", [corpus / "heldout", panel], right))
    out = tmp_path / "probe"
    assert probe.main(["--corpus", str(corpus), "--panel", str(panel), "--out", str(out), "--profile", str(profile),
                       "--deadline", "60"]) == 0
    report = json.loads((out / "probe.json").read_text())
    check_against_the_answer_files(report, {"heldout": corpus / "heldout", "real": panel}, tasks=2)
    assert report["panels"]["heldout"]["score"] == report["panels"]["real"]["score"] == 0.5  # one task of two right
    printed = capsys.readouterr().out
    assert "| heldout | 2 | 2 | 1 | 0.500 | 0 |" in printed
    real_inputs = len(load_labels(panel / f"{ids(panel)[1]}.json")[ids(panel)[1]])
    assert f"| real | 2 | {report['panels']['real']['test_inputs']} | {real_inputs} | 0.500 | 0 |" in printed

    # --max-tasks 1: each panel's first task by id only, scored against that task alone (the held-out one is right);
    # through the spelling, `python -m training.corpus probe ... --real TASKS`
    from training.corpus.__main__ import main as corpus_main

    out = tmp_path / "probe-1"
    with pytest.raises(SystemExit) as ended:
        corpus_main(["probe", "--corpus", str(corpus), "--real", str(panel), "--out", str(out), "--profile",
                     str(profile), "--deadline", "60", "--max-tasks", "1", "--json", str(tmp_path / "one.json")])
    assert ended.value.code == 0
    report = json.loads((tmp_path / "one.json").read_text())
    check_against_the_answer_files(report, {"heldout": corpus / "heldout", "real": panel}, tasks=1)
    assert (report["panels"]["heldout"]["score"], report["panels"]["real"]["score"]) == (1.0, 0.0)
    assert sorted(json.loads((out / "real" / "submission.json").read_text())) == ids(panel)[:1]


def test_unusable_panels_and_an_earlier_probe_are_refused_before_the_solver_runs(corpus, panel, tmp_path, capsys):
    empty = tmp_path / "empty-corpus"
    (empty / "heldout").mkdir(parents=True)
    assert probe.main(["--corpus", str(empty), "--panel", str(panel), "--out", str(tmp_path / "a")]) == 2
    assert f"{empty / 'heldout'}: holds no tasks" in capsys.readouterr().err
    unlabelled = tmp_path / "unlabelled"
    unlabelled.mkdir()
    task = json.loads(next(panel.glob("*.json")).read_text())
    (unlabelled / "t.json").write_text(json.dumps({"train": task["train"],
                                                   "test": [{"input": p["input"]} for p in task["test"]]}))
    assert probe.main(["--corpus", str(corpus), "--panel", str(unlabelled), "--out", str(tmp_path / "b")]) == 2
    assert str(unlabelled / "t.json") in capsys.readouterr().err
    (tmp_path / "c" / "heldout").mkdir(parents=True)
    (tmp_path / "c" / "heldout" / "attempts.jsonl").write_text("{}\n")
    assert probe.main(["--corpus", str(corpus), "--panel", str(panel), "--out", str(tmp_path / "c")]) == 2
    assert "holds an earlier probe's attempt log" in capsys.readouterr().err
    assert not (tmp_path / "a" / "probe.json").exists() and not (tmp_path / "b" / "heldout").exists()


@pytest.mark.timeout(600)
def test_the_tiny_model_runs_on_both_panels(corpus, panel, tmp_path, one_torch_thread):
    from build.models.tiny import make_checkpoint

    model = make_checkpoint(tmp_path / "tiny", "qwen3", seed=0)
    out = tmp_path / "probe"
    assert probe.main(["--corpus", str(corpus), "--panel", str(panel), "--out", str(out), "--profile", "cpu-tiny",
                       "--model", str(model), "--deadline", "15", "--scale-schedule"]) == 0
    report = json.loads((out / "probe.json").read_text())
    check_against_the_answer_files(report, {"heldout": corpus / "heldout", "real": panel}, tasks=2)
    for name, folder in (("heldout", corpus / "heldout"), ("real", panel)):
        records = read_log(out / name / "attempts.jsonl")
        assert records and {r.task_id for r in records} <= set(ids(folder))  # the model ran on this panel's tasks


def test_the_probe_gives_the_solver_the_arguments_its_command_line_would(tmp_path):
    """The probe calls the solver's library function (submission.lines.run_profile, which submission.main calls) with
    arguments built by submission.lines.arguments: they must be exactly what submission.main's parser gives for the
    same options, defaults included, or a line reading an option the builder lacks would fail only in the probe."""
    from submission.lines import arguments, entry_parser

    parse = entry_parser("python -m submission.main", "doc").parse_args
    assert vars(arguments(Path("t"), Path("o"))) == vars(parse(["--tasks", "t", "--out", "o"]))
    every = ["--tasks", "t", "--out", "o", "--profile", "p", "--model", "m", "--log", "l", "--deadline", "5",
             "--scale-schedule", "--solutions", "s", "--max-tasks", "2", "--resume", "--heartbeat", "h"]
    assert vars(arguments(Path("t"), Path("o"), "p", model="m", log=Path("l"), deadline=5.0, scale_schedule=True,
                          solutions=Path("s"), max_tasks=2, resume=True, heartbeat=Path("h"))) == vars(parse(every))
    options = probe.argparse.Namespace(profile="p", model="m", deadline=5.0, scale_schedule=True, max_tasks=2)
    built = probe.solver_arguments(options, tmp_path / "panel", tmp_path / "out")
    assert vars(built) == vars(parse(["--tasks", str(tmp_path / "panel"), "--solutions", str(tmp_path / "panel"),
                                      "--out", str(tmp_path / "out" / "submission.json"), "--log",
                                      str(tmp_path / "out" / "attempts.jsonl"), "--profile", "p", "--model", "m",
                                      "--deadline", "5", "--max-tasks", "2", "--scale-schedule"]))
