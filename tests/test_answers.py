"""The answer file: complete, and valid JSON at every instant even when the writer is SIGKILLed mid-write."""

from __future__ import annotations

import json
import os
import random
import signal
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from submission.answer_file import AnswerFile, render_submission
from submission.grids import EMPTY_ANSWER
from submission.tasks import load_tasks

REPO = Path(__file__).resolve().parents[1]


def test_render_is_complete_with_zero_fill():
    out = render_submission({"a": 2, "b": 1}, {("a", 1): (((1, 2),), ((3,),))})
    assert out == {"a": [{"attempt_1": [[0]], "attempt_2": [[0]]}, {"attempt_1": [[1, 2]], "attempt_2": [[3]]}],
                   "b": [{"attempt_1": [[0]], "attempt_2": [[0]]}]}


def test_render_refuses_unknown_inputs():
    with pytest.raises(KeyError, match="unknown"):
        render_submission({"a": 1}, {("a", 1): (EMPTY_ANSWER, EMPTY_ANSWER)})


def test_answer_file_exists_complete_before_any_answer(tmp_path, arc_data):
    tasks = load_tasks(arc_data / "arc-agi-2" / "evaluation")
    answers = AnswerFile(tmp_path / "submission.json", tasks.test_counts())
    written = json.loads((tmp_path / "submission.json").read_text())
    assert set(written) == {t.id for t in tasks.tasks}
    assert sum(len(v) for v in written.values()) == 167
    task = tasks.tasks[0]
    answers.update(task.id, 0, (task.test_outputs[0], EMPTY_ANSWER))
    assert json.loads((tmp_path / "submission.json").read_text())[task.id][0]["attempt_1"] == [
        list(r) for r in task.test_outputs[0]]
    assert [p.name for p in tmp_path.iterdir()] == ["submission.json"]  # no temporary files left


def test_the_answer_file_is_0644_whatever_the_umask_and_the_file_it_replaces(tmp_path):
    """Issue 27: mkstemp made the solver's answer file 0600, where boot's [[0]] fallback in the same place (open(),
    under the usual umask 022) is 0644: the file's mode must not depend on who wrote it last. Every write is 0644."""
    path = tmp_path / "submission.json"
    path.write_text("{}")
    path.chmod(0o600)
    old = os.umask(0o077)
    try:
        answers = AnswerFile(path, {"a": 1})
        assert stat.S_IMODE(path.stat().st_mode) == 0o644
        answers.update("a", 0, (((1,),), ((2,),)))
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["submission.json"]


WRITER = """
import random, sys
from submission.answer_file import AnswerFile
counts = {f"task{i:03d}": 1 + i % 3 for i in range(300)}
answers = AnswerFile(sys.argv[1], counts)
rng = random.Random(int(sys.argv[2]))
big = tuple(tuple(rng.randrange(10) for _ in range(30)) for _ in range(30))
for task, count in counts.items():  # every slot a 30x30 grid: ~2 MB a rewrite, so kills land mid-write
    for index in range(count):
        answers.answers[(task, index)] = (big, big)
answers.write()
print("ready", flush=True)
while True:
    task = rng.choice(list(counts))
    grid = tuple(tuple(rng.randrange(10) for _ in range(30)) for _ in range(30))
    answers.update(task, rng.randrange(counts[task]), (grid, grid))
"""


def read_complete(path: Path) -> dict:
    written = json.loads(path.read_text())  # raises if torn
    assert len(written) == 300 and all(len(v) == 1 + int(k[4:]) % 3 for k, v in written.items())
    assert all(set(slot) == {"attempt_1", "attempt_2"} for v in written.values() for slot in v)
    return written


def test_valid_at_every_instant_and_after_sigkill(tmp_path):
    """A reader polls the file while a writer rewrites it in a loop, then the writer is SIGKILLed at a random moment."""
    path = tmp_path / "submission.json"
    rng = random.Random(0)
    reads = 0
    for round_ in range(6):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), str(round_)], cwd=REPO,
                                stdout=subprocess.PIPE, text=True)
        try:
            assert proc.stdout.readline().strip() == "ready"
            until = time.monotonic() + rng.uniform(0.3, 0.8)
            while time.monotonic() < until:
                data = path.read_bytes()  # cheap check on every read, a full parse on some
                assert data.startswith(b'{"task000":[') and data.endswith(b"]}]}"), f"torn: {len(data)} bytes"
                if reads % 25 == 0:
                    read_complete(path)
                reads += 1
        finally:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
        read_complete(path)
    assert reads > 100
    for leftover in tmp_path.glob(".submission.json.*.tmp"):
        leftover.unlink()  # a kill between mkstemp and rename may leave one; the answer file itself is intact
