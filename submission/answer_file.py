"""The answer file `submission.json`: always complete, valid JSON at every instant, rewritten after every update.

Complete: every task id and every test input, with both attempts (`[[0]]` where nothing is known yet). Valid at every
instant: the new content goes to a temporary file in the same folder, is flushed and fsynced, then renamed over the old
one (rename is atomic within a file system), and the folder is fsynced so the rename survives a power cut. A SIGKILL
at any point leaves either the old file or the new one, never a torn one (tested by killing a writer in a loop).
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from submission.grids import EMPTY_ANSWER, Grid, to_json

AttemptPair = tuple[Grid, Grid]
MODE = 0o644  # mkstemp's 0600 made the solver's file unlike boot's [[0]] fallback (open(): 0644 under umask 022)


def render_submission(test_counts: dict[str, int], answers: dict[tuple[str, int], AttemptPair]) -> dict:
    """The submission as a JSON-ready dict: `{task_id: [{"attempt_1": g, "attempt_2": g}, ...]}`. Pure."""
    unknown = {key for key in answers if key[0] not in test_counts or not 0 <= key[1] < test_counts[key[0]]}
    if unknown:
        raise KeyError(f"answers for unknown test inputs: {sorted(unknown)[:5]}")
    out = {}
    for task_id, count in test_counts.items():
        slots = []
        for index in range(count):
            first, second = answers.get((task_id, index), (EMPTY_ANSWER, EMPTY_ANSWER))
            slots.append({"attempt_1": to_json(first), "attempt_2": to_json(second)})
        out[task_id] = slots
    return out


def write_atomic(path: str | Path, data: bytes) -> None:
    """Replace `path` with `data` so that readers (and a crash) only ever see the old or the new content. The file
    is `MODE` (0644) whatever the umask or the mode of the file it replaces."""
    path = Path(path)
    folder = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    try:
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), MODE)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def write_submission(path: str | Path, submission: dict) -> None:
    write_atomic(path, json.dumps(submission, separators=(",", ":")).encode())


class AnswerFile:
    """The solver's answer file: holds the current answers and rewrites the file after every update."""

    def __init__(self, path: str | Path, test_counts: dict[str, int]):
        self.path = Path(path)
        self.test_counts = dict(test_counts)
        self.answers: dict[tuple[str, int], AttemptPair] = {}
        self.write()  # a complete [[0]] file exists before any work starts

    def update(self, task_id: str, test_index: int, attempts: AttemptPair) -> None:
        if self.set(task_id, test_index, attempts):
            self.write()

    def set(self, task_id: str, test_index: int, attempts: AttemptPair) -> bool:
        """Change the answers in memory only (the caller writes); whether anything changed."""
        if self.answers.get((task_id, test_index)) == attempts:
            return False
        self.answers[(task_id, test_index)] = attempts
        return True

    def write(self) -> None:
        write_submission(self.path, render_submission(self.test_counts, self.answers))
