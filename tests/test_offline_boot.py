"""The grid line's and the combined bundles boot with the network cut: the grid line's bundle (grid-tiny: the tiny
Qwen3 cut to 16 tokens, two worker processes, PEFT from the bundle's wheels) installs into boot's own environment from
its own wheels only, passes the preflight and runs the commit run's rehearsal on three ARC-AGI-2 evaluation tasks,
and so does the combined bundle (both-tiny: the reasoning line's tiny model and the grid model in one dataset, both
lines rehearsed at once, their answers merged). The reasoning line's CPU bundle boots in tests/test_kaggle_rehearsal.py
from what the real Kaggle client uploads, with its failure matrix (a corrupt wheel among them).
Needs the engine environment and the CPU target's wheels (fetched into ~/.cache/arc-kit/wheels on first use: about
500 MB)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="the tiny model needs the engine environment")

from build.bundle.bundler import bundle, verify  # noqa: E402
from build.models.tiny import make_checkpoint  # noqa: E402
from kaggle_box import GUARD  # noqa: E402


def kaggle_input(root: Path, arc_data: Path, count: int = 3) -> dict:
    """/kaggle/input as the commit run sees it (the `count` smallest evaluation tasks as test and evaluation sets) and
    the socket guard under `root`; the challenges."""
    challenges, solutions = {}, {}
    for file in sorted((arc_data / "arc-agi-2" / "evaluation").glob("*.json"), key=lambda f: f.stat().st_size)[:count]:
        task = json.loads(file.read_text())
        challenges[file.stem] = {"train": task["train"], "test": [{"input": p["input"]} for p in task["test"]]}
        solutions[file.stem] = [p["output"] for p in task["test"]]
    data = root / "input" / "arc-prize"  # /kaggle/input as the commit run sees it
    data.mkdir(parents=True)
    (data / "arc-agi_test_challenges.json").write_text(json.dumps(challenges))
    (data / "arc-agi_evaluation_challenges.json").write_text(json.dumps(challenges))
    (data / "arc-agi_evaluation_solutions.json").write_text(json.dumps(solutions))
    (root / "guard").mkdir()
    (root / "guard" / "sitecustomize.py").write_text(GUARD)
    return challenges


def boot(root: Path, bundle_dir: Path, name: str, tasks: int = 3) -> subprocess.CompletedProcess:
    """A fresh virtual environment, no network namespace (where the machine allows one) and a socket guard."""
    venv = root / f"venv-{name}"
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_"))}
    env.update(PYTHONPATH=str(root / "guard"), HTTP_PROXY="http://127.0.0.1:9", HTTPS_PROXY="http://127.0.0.1:9",
               PIP_CONFIG_FILE=os.devnull)
    command = [str(venv / "bin" / "python"), str(bundle_dir / "kit" / "submission" / "kaggle" / "boot.py"), "--bundle",
               str(bundle_dir), "--input", str(root / "input"), "--out-dir", str(root / f"out-{name}"),
               "--rehearsal-tasks", str(tasks), "--rehearsal-deadline", "600"]
    if shutil.which("unshare") and subprocess.run(["unshare", "-n", "true"]).returncode == 0:
        command = ["unshare", "-n", *command]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=1500)


@pytest.mark.timeout(1800)
def test_a_grid_line_bundle_boots_offline_and_rehearses(tmp_path, arc_data):
    from build.models.grid_vocab import cut

    challenges = kaggle_input(tmp_path, arc_data)
    model = cut(make_checkpoint(tmp_path / "base", "qwen3", seed=0), tmp_path / "grid")
    made = bundle("grid-tiny", model, tmp_path / "bundle", target="cpu-py311")
    assert verify(made) == [] and "peft==" in json.loads((made / "manifest.json").read_text())["lock"]
    result = boot(tmp_path, made, "grid")
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "preflight: ok" in result.stdout and "ok   grid vocabulary" in result.stdout
    assert "rehearsal ok: every one of 3 tasks" in result.stdout and "score: task-weighted" in result.stdout
    answer = json.loads((tmp_path / "out-grid" / "submission.json").read_text())  # the commit run's: [[0]]
    assert all(slot == {"attempt_1": [[0]], "attempt_2": [[0]]} for slots in answer.values() for slot in slots)
    assert {k: len(v) for k, v in answer.items()} == {k: len(v["test"]) for k, v in challenges.items()}
    attempts = [json.loads(line) for line in
                (tmp_path / "out-grid" / "rehearsal" / "attempts.jsonl").read_text().splitlines()]
    assert {a["task_id"] for a in attempts} == set(challenges)
    assert all(a["grid"] is not None or a["parse_error"] for a in attempts)  # random weights may find no grid
    rehearsed = json.loads((tmp_path / "out-grid" / "rehearsal" / "submission.json").read_text())
    assert {k: len(v) for k, v in rehearsed.items()} == {k: len(v["test"]) for k, v in challenges.items()}


@pytest.mark.timeout(1800)
def test_a_combined_bundle_boots_offline_and_merges_both_lines(tmp_path, arc_data):
    """both-tiny's bundle: the tiny Qwen3 for the reasoning line (hf engine) in model/, the same cut to 16 tokens for
    one grid worker in grid-model/; the rehearsal runs submission.both on two real tasks and ends once each
    line's log has a finished attempt per task; its answer file is the merge of the two logs."""
    from build.models.grid_vocab import cut
    from submission.attempts import read_log
    from submission.merge import merge_logs

    challenges = kaggle_input(tmp_path, arc_data, count=2)
    reasoning = make_checkpoint(tmp_path / "base", "qwen3", seed=0)
    made = bundle("both-tiny", reasoning, tmp_path / "bundle", target="cpu-py311",
                  grid_model=cut(reasoning, tmp_path / "grid"))
    assert verify(made) == []
    manifest = json.loads((made / "manifest.json").read_text())
    assert {"model/config.json", "grid-model/config.json", "grid-model/grid_vocab.json"} <= set(manifest["files"])
    assert manifest["grid_model"]["source"] == str(tmp_path / "grid") and manifest["model"]["patches"]
    assert json.loads((made / "kit" / "bundle.json").read_text())["line"] == "both"
    result = boot(tmp_path, made, "both", tasks=2)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "preflight: ok" in result.stdout and "ok   grid line: grid vocabulary" in result.stdout
    assert "every task has a finished attempt: ending the solver now" in result.stdout
    assert "rehearsal ok: every one of 2 tasks got a finished attempt in each line's log" in result.stdout
    assert "score (both): task-weighted" in result.stdout
    answer = json.loads((tmp_path / "out-both" / "submission.json").read_text())  # the commit run's: [[0]]
    assert all(slot == {"attempt_1": [[0]], "attempt_2": [[0]]} for slots in answer.values() for slot in slots)
    folder = tmp_path / "out-both" / "rehearsal"
    logs = {line: read_log(folder / line / "attempts.jsonl") for line in ("reasoning", "grid")}
    for records in logs.values():  # both lines ran every task
        assert {r.task_id for r in records if not r.aborted} == set(challenges)
    counts = {task_id: len(task["test"]) for task_id, task in challenges.items()}
    merged = json.loads((folder / "submission.json").read_text())
    assert {(t, i): (tuple(map(tuple, s["attempt_1"])), tuple(map(tuple, s["attempt_2"])))
            for t, slots in merged.items() for i, s in enumerate(slots)} == merge_logs(counts, logs["reasoning"],
                                                                                        logs["grid"])
