"""The grid line's --resume: a run killed (coordinator and workers, SIGKILL) and restarted with the same log finishes
every task without redoing the ones it had finished and without losing their answers. The kill comes once a task is
finished; a run that finished them all before the kill landed has its log cut after its first task, as an earlier
kill would have left it, so the test never depends on which process gets there first (issue 45)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("peft")

from submission.attempts import read_log  # noqa: E402
from submission.grid.queue import task_cost  # noqa: E402
from submission.profiles import load_grid_profile, to_toml  # noqa: E402
from submission.tasks import load_tasks  # noqa: E402

REPO = Path(__file__).resolve().parents[1]


def finished_tasks(log: Path, counts: dict[str, int]) -> set[str]:
    slots = {(r.task_id, r.test_index, r.attempt) for r in read_log(log)} if log.exists() else set()
    return {t for t, n in counts.items() if all((t, i, a) in slots for i in range(n) for a in (1, 2))}


def cut_after_first_task(log: Path, counts: dict[str, int]) -> None:
    """The log as a kill just after its first finished task leaves it: its lines up to that task's last record."""
    lines, kept, slots = log.read_text().splitlines(keepends=True), [], set()
    for line in lines:
        kept.append(line)
        record = json.loads(line)
        slots.add((record["task_id"], record["test_index"], record["attempt"]))
        if any(all((t, i, a) in slots for i in range(n) for a in (1, 2)) for t, n in counts.items()):
            break
    log.write_text("".join(kept))


def test_a_killed_run_resumes_without_redoing_or_losing_tasks(arc_data, tmp_path):
    from build.models.grid_vocab import cut
    from build.models.tiny import make_checkpoint

    model = cut(make_checkpoint(tmp_path / "base", "qwen3", seed=4), tmp_path / "grid")
    profile = load_grid_profile("grid-tiny")
    profile = replace(profile, model=replace(profile.model, path=str(model)), ttt=replace(profile.ttt, sequences=2),
                      search=replace(profile.search, dihedrals=1, colour_perms=2, batch_s=2.0),
                      rescore=replace(profile.rescore, views=1),
                      run=replace(profile.run, devices=("cpu",), min_task_s=2.0, max_task_s=4.0))
    (tmp_path / "grid.toml").write_text(to_toml(profile))
    evaluation = tmp_path / "tasks"  # the three cheapest evaluation tasks
    evaluation.mkdir()
    for task in sorted(load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks, key=task_cost)[:3]:
        shutil.copy(arc_data / "arc-agi-2" / "evaluation" / f"{task.id}.json", evaluation)
    counts = {t.id: len(t.test_inputs) for t in load_tasks(evaluation).tasks}
    log, out = tmp_path / "attempts.jsonl", tmp_path / "submission.json"
    # a roomy deadline (the run ends when its tasks are done): a busy shared machine starts workers slowly
    cmd = [sys.executable, "-m", "submission.grid.main", "--tasks", str(evaluation), "--profile",
           str(tmp_path / "grid.toml"), "--deadline", "300", "--out", str(out), "--log", str(log)]
    run = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                           start_new_session=True)
    try:
        until = time.monotonic() + 300
        while not finished_tasks(log, counts) and time.monotonic() < until and run.poll() is None:
            time.sleep(0.1)
        os.killpg(run.pid, signal.SIGKILL)  # the whole run at once, workers included, as a lost machine
    finally:
        run.wait()
    assert finished_tasks(log, counts), "the run finished no task within 300 s"
    if finished_tasks(log, counts) == set(counts):  # the run outran the kill (issue 45: no test may race a process)
        cut_after_first_task(log, counts)
    before = read_log(log)
    finished = finished_tasks(log, counts)
    assert finished and finished != set(counts)
    answers_before = json.loads(out.read_text())

    refused = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=60)
    assert refused.returncode == 2 and "--resume" in refused.stderr  # a new run never appends to an old log

    done = subprocess.run(cmd + ["--resume"], cwd=REPO, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    after = read_log(log)
    assert after[:len(before)] == before  # nothing lost
    again = Counter(r.task_id for r in after[len(before):])
    assert not set(again) & finished  # nothing finished was redone
    assert finished_tasks(log, counts) == set(counts)
    answers = json.loads(out.read_text())
    assert set(answers) == set(counts)
    for task_id in finished:
        assert answers[task_id] == answers_before[task_id]  # restored answers, not [[0]]
    assert f"(restored: {len(finished)})" in done.stdout
