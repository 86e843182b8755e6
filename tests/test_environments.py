"""The cached environments: a fresh clone reuses them, and two clones may set one up at the same moment.

Environments live outside the clone, in folders named by the hash of their requirement files (Makefile), built by
requirements/install.sh under a lock. These tests use a scratch cache and a requirements file with no packages, so
they need neither the network nor minutes of installs.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(shutil.which("make") is None or shutil.which("flock") is None,
                                reason="needs make and flock")


def dry_run(clone: Path, cache: Path) -> str:
    """What `make env` would do in this clone (make -n prints the commands it would run)."""
    return subprocess.run(["make", "--no-print-directory", "-n", "env", f"KIT_CACHE={cache}", f"PYTHON={sys.executable}"],
                          cwd=clone, capture_output=True, text=True, check=True).stdout


def test_fresh_clone_reuses_a_finished_environment(tmp_path):
    """A clone's requirement files are newer than any stamp: the stamp must still count (the folder holds the hash)."""
    clone, cache = tmp_path / "clone", tmp_path / "cache"
    subprocess.run(["git", "clone", "-q", str(REPO), str(clone)], check=True)
    for name in ("Makefile", "requirements/install.sh"):  # the working tree's versions, committed or not
        shutil.copy(REPO / name, clone / name)
    planned = dry_run(clone, cache)
    venv = next((Path(word) for word in planned.split() if Path(word).name.startswith("venv-core-")), None)
    assert venv is not None and venv.parent == cache, planned  # nothing set up yet: it would install there
    (venv).mkdir(parents=True)
    (venv / ".installed").touch()
    stamp = (venv / ".installed").stat().st_mtime
    os.utime(clone / "requirements" / "core.txt", (stamp + 60, stamp + 60))  # newer than the stamp, as in a fresh clone
    again = dry_run(clone, cache)
    assert str(venv) not in again, f"a fresh clone would reinstall a finished environment:\n{again}"


def test_two_concurrent_setups_of_one_environment(tmp_path):
    """Both succeed; the environment is built once; the second waits on the lock and finds the stamp."""
    requirements = tmp_path / "nothing.txt"
    requirements.write_text("# no packages: the set-up itself is under test\n")
    venv = tmp_path / "cache" / "venv-test"

    def setup(_):
        return subprocess.run(["bash", str(REPO / "requirements" / "install.sh"), sys.executable, str(venv),
                               str(requirements)], capture_output=True, text=True)

    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(setup, range(2)))
    assert [r.returncode for r in results] == [0, 0], [r.stderr for r in results]
    assert sum(r.stdout.count("== setting up") for r in results) == 1
    assert (venv / ".installed").is_file() and (venv / "bin" / "python").exists()


def test_an_interrupted_setup_is_rebuilt(tmp_path):
    requirements = tmp_path / "nothing.txt"
    requirements.write_text("\n")
    venv = tmp_path / "venv-half"
    venv.mkdir()
    (venv / "leftover").touch()  # a half-built folder: no stamp
    done = subprocess.run(["bash", str(REPO / "requirements" / "install.sh"), sys.executable, str(venv),
                           str(requirements)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert not (venv / "leftover").exists() and (venv / ".installed").is_file()
