"""submission.main end to end with the replay engine: the answer file, the log, SIGKILL and --resume, the deadline."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from submission.attempts import AttemptRecord, read_log
from submission.schedule import Level
from submission.tasks import load_tasks

REPO = Path(__file__).resolve().parents[1]



def logged_attempts(tasks, rng: random.Random) -> list[AttemptRecord]:
    """A made-up earlier run: per input three attempts, some with the right grid, with durations of ~0.2-0.6 s."""
    records = []
    for task in tasks:
        for index, label in enumerate(task.test_outputs):
            for attempt in (1, 2, 3):
                grid = label if rng.random() < 0.3 else ((rng.randrange(10),),)
                records.append(AttemptRecord(task.id, index, attempt, Level(attempt - 1), 0, 4000, natural=True,
                                             thinking_tokens=rng.randint(100, 900), answer_tokens=50, grid=grid,
                                             started_s=0.0, finished_s=rng.uniform(0.2, 0.6)))
    return records


@pytest.fixture(scope="module")
def setup(arc_data, tmp_path_factory):
    folder = tmp_path_factory.mktemp("replay")
    tasks = load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks[:10]
    source = folder / "earlier.jsonl"
    source.write_text("".join(json.dumps(r.to_json()) + "\n" for r in logged_attempts(tasks, random.Random(0))))
    return folder, source, tasks


def main_cmd(folder: Path, profile: Path, tasks_dir: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "submission.main", "--tasks", str(tasks_dir), "--max-tasks", "10", "--out",
            str(folder / "submission.json"), "--profile", str(profile), "--log", str(folder / "run.jsonl"), *extra]


def test_kill_and_resume_keeps_every_finished_attempt_exactly_once(setup, arc_data, replay_profile):
    folder, source, tasks = setup
    profile = replay_profile(folder, source, scale=1.0)
    cmd = main_cmd(folder, profile, arc_data / "arc-agi-2" / "evaluation")
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        # Kill once a few attempts are in the log, however long a loaded machine takes to write them (pytest's
        # timeout bounds the wait; a wall-clock bound here failed on busy machines, issue 45's list of such tests).
        while proc.poll() is None:
            if (folder / "run.jsonl").exists() and len((folder / "run.jsonl").read_text().splitlines()) >= 8:
                break
            time.sleep(0.05)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait()
    before = read_log(folder / "run.jsonl")
    assert 8 <= len(before) < 60
    json.loads((folder / "submission.json").read_text())  # valid at the kill

    done = subprocess.run(cmd + ["--resume"], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    after = read_log(folder / "run.jsonl")
    keys = Counter((r.task_id, r.test_index, r.attempt) for r in after)
    assert max(keys.values()) == 1  # nothing redone
    assert after[:len(before)] == before  # nothing lost
    inputs = {(t.id, i) for t in tasks for i in range(len(t.test_inputs))}
    firsts = {(r.task_id, r.test_index) for r in after if r.level is Level.FIRST}
    seconds = {(r.task_id, r.test_index) for r in after if r.level is Level.SECOND}
    assert firsts == inputs == seconds
    submission = json.loads((folder / "submission.json").read_text())
    assert set(submission) == {t.id for t in tasks}
    assert "answered test inputs" in done.stdout


def test_deadline_is_kept_even_with_slow_attempts(setup, arc_data, tmp_path, replay_profile):
    folder, source, tasks = setup
    profile = replay_profile(tmp_path, source, scale=40.0)  # attempts take 8-24 s: the deadline cuts the run
    cmd = [sys.executable, "-m", "submission.main", "--tasks", str(arc_data / "arc-agi-2" / "evaluation"),
           "--max-tasks", "10", "--out", str(tmp_path / "submission.json"), "--profile", str(profile),
           "--deadline", "20", "--log", str(tmp_path / "run.jsonl")]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert time.monotonic() - started < 20
    submission = json.loads((tmp_path / "submission.json").read_text())
    assert sum(len(v) for v in submission.values()) == sum(len(t.test_inputs) for t in tasks)
    aborted = int(done.stdout.split("aborted at the hard stop: ")[1].split(",")[0])
    assert aborted >= 1  # the hard stop (deadline - 5 s) cut running attempts off


BLOCKING = """
import sys, time
import submission.main as solver
from submission.reasoning.engines.base import ThroughputMeter

class Frozen:  # blocks the event loop itself: only the watchdog can end the run
    meter = ThroughputMeter()
    async def start(self): pass
    async def generate(self, request):
        time.sleep(3600)
    async def abort(self, request_id): pass
    async def close(self): pass

sys.exit(solver.main(sys.argv[1:], new_engine=lambda profile: Frozen()))
"""


def test_watchdog_ends_a_run_whose_engine_blocks_everything(setup, arc_data, tmp_path, replay_profile):
    folder, source, tasks = setup
    profile = replay_profile(tmp_path, source, scale=1.0)
    cmd = [sys.executable, "-c", BLOCKING, "--tasks", str(arc_data / "arc-agi-2" / "evaluation"), "--max-tasks", "10",
           "--out", str(tmp_path / "submission.json"), "--profile", str(profile), "--deadline", "12"]
    started = time.monotonic()
    done = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    elapsed = time.monotonic() - started
    assert 7 <= elapsed < 12, elapsed  # after the hard stop (12 - 5 s), before the limit
    assert done.returncode == 0 and "watchdog" in done.stderr
    submission = json.loads((tmp_path / "submission.json").read_text())
    assert sum(len(v) for v in submission.values()) == sum(len(t.test_inputs) for t in tasks)


def test_a_deadline_inside_the_margins_is_refused_unless_the_schedule_is_scaled(arc_data, tmp_path, capsys):
    """Issue 12: `--deadline 240` under the MoE profile's 7/15-minute margins made zero attempts; now it is refused
    with the numbers, and `--scale-schedule` is the way to a short run."""
    from submission.main import main

    args = ["--tasks", str(arc_data / "arc-agi-2" / "evaluation"), "--max-tasks", "1", "--profile", "moe-4xL4",
            "--model", str(tmp_path / "absent"), "--out", str(tmp_path / "submission.json"), "--deadline", "240"]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "time_limit_s 240 s" in err and "(900 s)" in err and "--scale-schedule" in err
    assert not (tmp_path / "submission.json").exists()
