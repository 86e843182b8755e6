"""Append-only, kill-safe files for a corpus run (issue 32 section 3).

Every file a run writes goes through `write`: the bytes go to a temporary file, which is flushed and fsynced, then
renamed over the final name (atomic on POSIX), and the folder is fsynced. A kill therefore leaves either the old file
or the new one, never a torn one. A run's progress is a sequence of shards, each a data file followed by its entry
file (the commit mark): a data file without its entry is ignored and written again.

A test names the steps to kill at: with `CORPUS_KILL_AT=<step>:<n>` in the environment, the process sends itself
SIGKILL just before the n-th rename of that step. `taken` lists the steps this process has reached, in order.
"""

from __future__ import annotations

import os
import signal
from collections import Counter
from pathlib import Path
from typing import Iterable

KILL_AT = "CORPUS_KILL_AT"
taken: list[str] = []
_counts: Counter = Counter()


class CorpusError(ValueError):
    """A corpus folder or setting that cannot be used; the message names the folder or file and the field."""


def step(name: str) -> None:
    """Mark a write step; SIGKILL here if `CORPUS_KILL_AT` names this occurrence (the kill test's hook)."""
    _counts[name] += 1
    taken.append(name)
    if os.environ.get(KILL_AT) == f"{name}:{_counts[name]}":
        os.kill(os.getpid(), signal.SIGKILL)


def reset() -> None:
    """Forget the steps counted so far (a forked test child starts its count afresh)."""
    taken.clear()
    _counts.clear()


def write(path: Path, data: bytes, name: str) -> None:
    """Write `data` to `path` whole or not at all, durably (write, fsync, rename, fsync the folder)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "wb") as out:
        out.write(data)
        out.flush()
        os.fsync(out.fileno())
    _commit(tmp, path, name)


def write_lines(path: Path, lines: Iterable[str], name: str) -> None:
    """`write` for a stream of text lines, never held in memory whole (the manifest of a large corpus)."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as out:
        for line in lines:
            out.write(line)
        out.flush()
        os.fsync(out.fileno())
    _commit(tmp, path, name)


def _commit(tmp: Path, path: Path, name: str) -> None:
    step(name)
    os.replace(tmp, path)
    folder = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(folder)
    finally:
        os.close(folder)
