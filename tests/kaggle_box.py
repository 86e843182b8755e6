"""A Kaggle notebook machine, faked as closely as this machine allows: the rehearsal's harness and its failure
matrix's (tests/test_kaggle_rehearsal.py, `make kaggle-rehearsal`).

    box = Box(tmp)                                   # tmp/input (read-only at run time), tmp/working, tmp/image
    box.attach_competition("arc-prize-2025", challenges, solutions)
    box.attach(mount(...))                           # the kit dataset as the real client uploaded it (kaggle_client)
    result = box.run_notebook(rerun=False)           # the notebook's cells in order, as Kaggle runs them
    assert answer_problems(box.answer, challenges) == []

What is real: the notebook's own cells (kaggle/notebook.ipynb, run in order in one namespace, stopping at the first
exception), the kit dataset laid out from what the real Kaggle client sent, an "image" Python of its own (a virtual
environment, optionally seeded with other versions of locked packages), /kaggle/input mounted read-only and the network
cut (a mount and network namespace: `unshare -m -n`, where the machine allows it, else a socket guard only), the
competition rerun's environment variable. What is injected, one fault at a time (`Fault`): a SIGKILL or SIGSTOP of
the solver once its first attempt is logged (found in /proc by its command line), and a working disk that is full
after cell 1 (a small tmpfs filled to the last byte). Not faked: GPUs (the CPU target's bundle runs the hf engine),
Kaggle's own image, its 20 GB output limit and its clock (the deadline is the notebook's 12 hours, which the tiny
model's queue never reaches).
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
GUARD = """import socket
def _refuse(*args, **kwargs):
    raise OSError("network access attempted in the Kaggle box")
socket.socket.connect = _refuse
socket.create_connection = _refuse
"""
RUNNER = """import atexit, json, os, shutil, sys, traceback
cells = [''.join(c["source"]) for c in json.load(open(sys.argv[1]))["cells"] if c["cell_type"] == "code"]
namespace = {"__name__": "__main__"}
fill_after = os.environ.get("ARC_KIT_BOX_FILL_AFTER_CELL")
answer = os.path.join(os.environ["ARC_KIT_WORKING"], "submission.json")
if os.environ.get("ARC_KIT_BOX_KEEP"):  # what Kaggle scores: the answer file as the notebook ends
    atexit.register(lambda: os.path.exists(answer) and shutil.copy(answer, os.environ["ARC_KIT_BOX_KEEP"]))
for number, source in enumerate(cells, 1):
    try:
        exec(compile(source, f"cell {number}", "exec"), namespace)
    except Exception:
        traceback.print_exc()
        print(f"NOTEBOOK STOPPED IN CELL {number}", file=sys.stderr)
        sys.exit(1)
    if fill_after == str(number):  # the fault: the working disk fills up once this cell has run
        with open(os.path.join(os.environ["ARC_KIT_WORKING"], "filler"), "wb", buffering=0) as f:
            try:
                while True:
                    f.write(b"\\0" * 4096)
            except OSError as err:
                print(f"BOX: working disk filled ({err.strerror})", flush=True)
"""
ISOLATE = """set -e
mount --make-rprivate /
mount --bind "$ARC_KIT_INPUT" "$ARC_KIT_INPUT"
mount -o remount,ro,bind "$ARC_KIT_INPUT"
if [ -n "$ARC_KIT_BOX_WORKING_BYTES" ]; then
    mount -t tmpfs -o size="$ARC_KIT_BOX_WORKING_BYTES" tmpfs "$ARC_KIT_WORKING"
fi
exec "$@"
"""


def namespaces_allowed() -> bool:
    """Whether this machine lets us mount (read-only input, a small working disk) and cut the network."""
    return bool(shutil.which("unshare")) and subprocess.run(
        ["unshare", "-m", "-n", "sh", "-c", "mount --make-rprivate / && mount -t tmpfs tmpfs /mnt"],
        capture_output=True).returncode == 0


@dataclass(frozen=True)
class Fault:
    """One injected fault: `signal` sent to the solver once its log (`log`, under working/) holds a finished attempt
    (`times` times, each after the previous life logged a new one), or the working disk full after cell 1."""

    name: str
    signal: int | None = None
    times: int = 1
    log: str = "attempts.jsonl"
    disk_full: bool = False


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    signalled: list[int] = field(default_factory=list)  # pids the fault was sent to


def solver_pids(marker: str) -> list[int]:
    """Processes running `-m submission.main` (or the grid line's) whose command line mentions `marker`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = [a.decode(errors="replace") for a in argv]
        if "-m" in text and any(a.startswith("submission.") for a in text) and any(marker in a for a in text):
            pids.append(int(entry.name))
    return pids


def finished_records(log: Path) -> int:
    """Finished attempts in a solver's log (a line being written is not counted)."""
    try:
        whole = log.read_text().split("\n")[:-1]
    except OSError:
        return 0
    return sum(not json.loads(line)["aborted"] for line in whole if line.strip())


class Box:
    def __init__(self, root: Path):
        self.root = root
        for folder in (self.input, self.working):
            folder.mkdir(parents=True, exist_ok=True)
        (root / "guard").mkdir(exist_ok=True)
        (root / "guard" / "sitecustomize.py").write_text(GUARD)

    input = property(lambda self: self.root / "input")
    working = property(lambda self: self.root / "working")
    work = property(lambda self: self.root / "arc-kit-work")  # boot's local disk: its environment, extractions
    answer = property(lambda self: self.root / "scored-submission.json")  # copied out as the notebook ends

    def image(self, seed: list[Path] = (), name: str = "image") -> Path:
        """The image's Python, which runs the notebook from now on: a virtual environment `name`, with `seed`
        wheels installed (other versions of locked packages, as Kaggle's image has its own)."""
        venv = self.root / name
        if not (venv / "bin" / "python").exists():
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        if seed:
            subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--no-index",
                            "--no-deps", *map(str, seed)], check=True)
        self.python = venv / "bin" / "python"
        return self.python

    def attach_competition(self, slug: str, challenges: dict, solutions: dict | None = None,
                           evaluation: bool | dict = True) -> Path:
        """The competition's data at input/<slug>/: the test file and (the commit run's rehearsal) the public
        evaluation files: `evaluation` itself when a dict, else (True) the test file's tasks."""
        folder = self.input / slug
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "arc-agi_test_challenges.json").write_text(json.dumps(challenges))
        if evaluation:
            public = evaluation if isinstance(evaluation, dict) else challenges
            (folder / "arc-agi_evaluation_challenges.json").write_text(json.dumps(public))
            (folder / "arc-agi_evaluation_solutions.json").write_text(json.dumps(solutions or {}))
        return folder

    def reset_output(self) -> None:
        """A new session's /kaggle/working (boot's work folder, its installed environment, survives: the matrix
        installs once and reuses it; FULL rehearsals remove it too)."""
        shutil.rmtree(self.working, ignore_errors=True)
        self.working.mkdir()

    def run_notebook(self, rerun: bool, fault: Fault | None = None, timeout: float = 1500,
                     extra_env: dict | None = None) -> Result:
        notebook = self.root / "notebook.ipynb"
        from build.bundle.notebook import notebook as make_notebook

        notebook.write_text(json.dumps(make_notebook()))
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("PYTHON", "VIRTUAL_ENV", "PIP_", "KAGGLE_IS_COMPETITION_RERUN"))}
        env.update(PYTHONPATH=str(self.root / "guard"), HTTP_PROXY="http://127.0.0.1:9",
                   HTTPS_PROXY="http://127.0.0.1:9", PIP_CONFIG_FILE=os.devnull, ARC_KIT_INPUT=str(self.input),
                   ARC_KIT_WORKING=str(self.working), PYTHONUNBUFFERED="1", ARC_KIT_BOX_KEEP=str(self.answer),
                   **(extra_env or {}))
        self.answer.unlink(missing_ok=True)
        if rerun:
            env["KAGGLE_IS_COMPETITION_RERUN"] = "1"
        command = [str(getattr(self, "python", None) or self.image()), "-c", RUNNER, str(notebook)]
        if fault and fault.disk_full:
            env.update(ARC_KIT_BOX_FILL_AFTER_CELL="1", ARC_KIT_BOX_WORKING_BYTES="1m")
        if namespaces_allowed():
            command = ["unshare", "-m", "-n", "sh", "-c", ISOLATE, "isolate", *command]
        elif fault and fault.disk_full:
            raise RuntimeError("a full working disk needs a mount namespace (unshare -m), which this machine refuses")
        proc = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        signalled: list[int] = []
        if fault and fault.signal is not None:
            threading.Thread(target=self._inject, args=(fault, proc, signalled), daemon=True).start()
        try:
            out, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
            err += f"\nBOX: the notebook did not end within {timeout:.0f} s"
        return Result(proc.returncode, out, err, signalled)

    def _inject(self, fault: Fault, notebook: subprocess.Popen, signalled: list[int]) -> None:
        """Send `fault.signal` to the solver once its log has a new finished attempt, `fault.times` times."""
        log, seen = self.working / fault.log, 0
        while notebook.poll() is None and len(signalled) < fault.times:
            count = finished_records(log)
            pids = solver_pids(str(self.working))
            if count > seen and pids:
                for pid in pids:
                    try:
                        os.kill(pid, fault.signal)
                    except ProcessLookupError:
                        continue
                signalled.append(pids[0])
                seen = count
                print(f"BOX: {fault.name}: signal {fault.signal} sent to {pids} after {count} logged attempts",
                      file=sys.stderr, flush=True)
            time.sleep(0.05)


def _grid_ok(grid: object) -> bool:
    return (isinstance(grid, list) and 1 <= len(grid) <= 30 and all(isinstance(r, list) for r in grid)
            and 1 <= len(grid[0]) <= 30 and all(len(r) == len(grid[0]) for r in grid)
            and all(type(c) is int and 0 <= c <= 9 for r in grid for c in r))


def answer_problems(answer: Path, challenges: dict) -> list[str]:
    """What keeps `answer` from being a complete answer file for `challenges`: every task, one slot per test input
    (one for a task without "test"), two attempts each, valid grids. Empty when complete."""
    try:
        written = json.loads(answer.read_text())
    except (OSError, ValueError) as err:
        return [f"{answer}: {err}"]
    problems = []
    for task_id, task in challenges.items():
        slots = written.get(task_id)
        expected = max(1, len(task.get("test") or []))
        if not isinstance(slots, list) or len(slots) != expected:
            problems.append(f"{task_id}: {expected} slots expected, found {slots!r:.60}")
            continue
        for index, slot in enumerate(slots):
            if not (isinstance(slot, dict) and all(_grid_ok(slot.get(k)) for k in ("attempt_1", "attempt_2"))):
                problems.append(f"{task_id}[{index}]: not two valid grids: {slot!r:.80}")
    problems += [f"{task_id}: not a task of the test set" for task_id in written if task_id not in challenges]
    return problems


def answered(answer: Path) -> int:
    """Test inputs whose first attempt is not the [[0]] placeholder."""
    written = json.loads(answer.read_text())
    return sum(slot["attempt_1"] != [[0]] for slots in written.values() for slot in slots)


def stop_leftovers(marker: str) -> None:
    """End solvers a failed test left behind (a stopped one too)."""
    for pid in solver_pids(marker):
        for sig in (signal.SIGCONT, signal.SIGKILL):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
