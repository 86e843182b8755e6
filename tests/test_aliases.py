"""The paths users and old notebooks type keep working for one release after issue 46 moved their modules: each alias
runs the module at its new place (its own usage line answers `--help`) and says where it went. build/'s commands that
became rooms (build.prune, build.quantize, build.bundle) keep their path for good: the room's __main__ runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize(("command", "usage", "moved"), [
    (["-m", "submission.preflight"], "usage: python -m submission.kaggle.preflight", "submission.kaggle.preflight"),
    (["-m", "submission.library"], "usage: python -m submission.sandbox.library", "submission.sandbox.library"),
    (["-m", "submission.sandbox"], "usage: python -m submission.sandbox", None),
    ([str(REPO / "submission" / "boot.py")], "usage: boot.py", "submission/kaggle/boot.py"),
], ids=["preflight", "library", "sandbox", "boot-by-path"])
def test_an_old_path_runs_the_moved_module(command, usage, moved, tmp_path):
    # from another folder, as a notebook runs kit/submission/boot.py: the alias must find the kit itself
    done = subprocess.run([sys.executable, *command, "--help"], cwd=tmp_path if moved and "/" in moved else REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(usage), done.stdout[:200]
    assert moved is None or f"moved to {moved}" in done.stderr


def test_the_old_notebooks_import_still_finds_keep_complete():
    """A notebook generated before the move imports keep_complete from submission.kaggle_mounts."""
    from submission.kaggle.mounts import keep_complete
    from submission.kaggle_mounts import keep_complete as old

    assert old is keep_complete


@pytest.mark.parametrize(("old", "moved"), [
    ("build.tiny", "build.models.tiny"), ("build.grid_vocab", "build.models.grid_vocab"),
    ("build.calibrate", "build.prune.calibrate"), ("build.experts", "build.prune.experts"),
    ("build.adoption", "build.prune.adoption"), ("build.notebook", "build.bundle.notebook"),
])
def test_an_old_build_path_runs_the_moved_module(old, moved):
    """`python -m build.tiny` and the other build/ commands that moved into a room still run, and say where to."""
    done = subprocess.run([sys.executable, "-m", old, "--help"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: python -m {moved}"), done.stdout[:200]
    assert f"moved to {moved}" in done.stderr


@pytest.mark.parametrize("room", ["prune", "quantize", "bundle"])
def test_a_build_room_runs_its_command_as_typed(room):
    """build.prune, build.quantize and build.bundle became rooms (packages): `python -m build.<room>` runs the pruner,
    the quantiser and the bundler as before, with nothing about a move (it is their lasting path)."""
    done = subprocess.run([sys.executable, "-m", f"build.{room}", "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"usage: python -m build.{room} "), done.stdout[:200]
    assert "moved" not in done.stderr
