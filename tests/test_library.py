"""submission.sandbox.library as a tool for real program sets: pairing by name, limits from the command line, the
outcome table and its JSON, no sandbox folder left by a multi-worker run, and quiet exits when the reader closes the
pipe."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PROGRAMS = REPO / "examples" / "programs"
TASK_IDS = ("3c9b0459", "74dd1130", "0d3d703e")


def task_folder(arc_data: Path, tmp_path: Path) -> Path:
    folder = tmp_path / "tasks"
    folder.mkdir()
    for task_id in TASK_IDS:
        shutil.copy(arc_data / "arc-agi-2" / "training" / f"{task_id}.json", folder)
    return folder


def program_folder(tmp_path: Path) -> Path:
    """A right program for 3c9b0459, a wrong one for 74dd1130, one that loops for 0d3d703e, one for no task."""
    folder = tmp_path / "programs"
    folder.mkdir()
    shutil.copy(PROGRAMS / "3c9b0459.py", folder)
    shutil.copy(REPO / "tests" / "wrong_programs" / "74dd1130.py", folder)
    (folder / "0d3d703e.py").write_text("def transform(grid):\n    while True:\n        pass\n")
    (folder / "ffffffff.py").write_text("def transform(grid):\n    return grid\n")
    return folder


def library(*args: str, tmpdir: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "submission.sandbox.library", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, TMPDIR=str(tmpdir)))


def test_pair_by_name_limits_and_the_outcome_table(arc_data, tmp_path):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    tasks, programs = task_folder(arc_data, tmp_path), program_folder(tmp_path)
    done = library("--tasks", str(tasks), "--programs", str(programs), "--out", str(tmp_path / "sub.json"),
                   "--pair-by-name", "--cpu-s", "1", "--wall-s", "2", "--json", str(tmp_path / "report.json"),
                   tmpdir=scratch)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads((tmp_path / "report.json").read_text())
    # three checks, one per task (ffffffff.py names no task); the loop is stopped by the 1 s CPU limit
    assert report["checks"] == {"right": 1, "wrong": 1, "timeout": 1, "error": 0, "crash": 0}
    assert report["tasks"] == {"3c9b0459": {"train_perfect": ["3c9b0459"], "solved_by": ["3c9b0459"]}}
    assert "check outcomes" in done.stdout and "checks: 3;" in done.stdout
    assert list(scratch.iterdir()) == []


def test_every_program_on_every_task_leaves_no_sandbox_folder(arc_data, tmp_path):
    """Two workers, each with its own sandbox created in a pool thread: nothing is left in TMPDIR at the end."""
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    tasks = task_folder(arc_data, tmp_path)
    done = library("--tasks", str(tasks), "--programs", str(PROGRAMS), "--out", str(tmp_path / "sub.json"),
                   "--workers", "2", tmpdir=scratch)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"checks: {3 * len(list(PROGRAMS.glob('*.py')))};" in done.stdout
    assert list(scratch.iterdir()) == []


def test_a_closed_pipe_ends_the_sandbox_command_quietly(arc_data):
    read_end, write_end = os.pipe()
    os.close(read_end)  # `| head` that has already exited: every write fails with EPIPE
    done = subprocess.run([sys.executable, "-m", "submission.sandbox", "--program", str(PROGRAMS / "3c9b0459.py"),
                           "--task", str(arc_data / "arc-agi-2" / "training" / "3c9b0459.json")], cwd=REPO,
                          stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(write_end)
    assert done.returncode == 0 and done.stderr == "", done.stderr
