"""Attempt records and the attempt log (JSONL): what the solver writes, `--resume` reads and the simulator replays.

One record per finished attempt (SPEC section 2): which input and attempt, level, view, seed, cap, how thinking ended,
the grid (or why none), the program and its check, times and token counts. The log is appended one line per record,
flushed and fsynced, so a kill loses at most the line being written; a torn last line is ignored on reading and cut
by `repair_log` before a resumed run appends to the log (else the next record would join it and a second resume fail).
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from submission.grids import Grid, to_grid, to_json
from submission.schedule import Level, Outcome


@dataclass(frozen=True)
class AttemptRecord:
    task_id: str
    test_index: int
    attempt: int
    level: Level
    seed: int
    cap: int
    view: dict = field(default_factory=dict)  # View.to_json()
    natural: bool = False  # thinking ended with </think> before the cap
    thinking_tokens: int = 0
    answer_tokens: int = 0  # grid + cue + program + end of turn
    prompt_tokens: int = 0
    grid: Grid | None = None
    parse_error: str | None = None  # why there is no grid
    program: str | None = None
    train_perfect: bool = False
    demos_right: int = 0
    program_outputs: tuple[Grid | None, ...] = ()  # the program's output on each test input of the task
    started_s: float = 0.0  # seconds since the run started
    finished_s: float = 0.0
    aborted: bool = False  # stopped by the hard stop or an engine failure
    finish: str = ""  # the engine's finish: "stop", "length", "aborted", "error: ..."
    turns: int = 1  # requests made: more than one only for the tool agent (tokens are their sums)
    grid_line: dict = field(default_factory=dict)  # grid line (submission/grid): worker, candidates, stage seconds

    @property
    def tokens(self) -> int:
        return self.thinking_tokens + self.answer_tokens

    def outcome(self) -> Outcome:
        return Outcome(self.task_id, self.test_index, self.attempt, self.level, self.natural, self.grid,
                       self.thinking_tokens, self.train_perfect, self.demos_right)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["level"] = int(self.level)
        out["grid"] = to_json(self.grid) if self.grid is not None else None
        out["program_outputs"] = [to_json(g) if g is not None else None for g in self.program_outputs]
        if not self.grid_line:  # reasoning-line records stay as they were
            del out["grid_line"]
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> AttemptRecord:
        known = {f.name for f in fields(cls)}
        unknown = set(raw) - known
        if unknown:
            raise ValueError(f"attempt record: unknown fields {sorted(unknown)}")
        values = dict(raw)
        values["level"] = Level(raw["level"])
        values["grid"] = to_grid(raw["grid"]) if raw.get("grid") is not None else None
        values["program_outputs"] = tuple(to_grid(g) if g is not None else None for g in raw.get("program_outputs", []))
        return cls(**values)


class AttemptLog:
    """Append-only JSONL of attempt records, fsynced after every line. A line that cannot be written whole (a full
    disk) is taken back, so the log never holds a torn line before a whole one; the error is raised."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view):]

    def append(self, record: AttemptRecord) -> None:
        data = (json.dumps(record.to_json(), separators=(",", ":")) + "\n").encode()
        size = os.fstat(self._fd).st_size
        try:
            self._write(data)
            os.fsync(self._fd)
        except OSError:
            try:
                os.ftruncate(self._fd, size)
            except OSError:
                pass  # the torn tail stays; --resume cuts it
            raise

    def close(self) -> None:
        os.close(self._fd)


def read_log(path: str | Path) -> list[AttemptRecord]:
    """Every whole record in a log. A torn last line (a kill mid-write) is skipped; a bad line elsewhere raises with
    the file and line number."""
    path = Path(path)
    lines = path.read_text(encoding="utf-8").split("\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            records.append(AttemptRecord.from_json(json.loads(line)))
        except (ValueError, KeyError, TypeError) as err:
            if number == len(lines):
                break  # a last line without its newline was cut by a kill
            raise ValueError(f"{path}:{number}: bad attempt record: {err}") from None
    return records


def tail_repair(data: bytes) -> tuple[int, bytes]:
    """How to make a log end on a whole line: (bytes to keep, bytes to add). A last line without its newline that
    holds a whole record gets its newline; a torn one is cut. Pure."""
    if not data or data.endswith(b"\n"):
        return len(data), b""
    cut = data.rfind(b"\n") + 1
    try:
        AttemptRecord.from_json(json.loads(data[cut:]))
    except (ValueError, KeyError, TypeError):  # UnicodeDecodeError and JSONDecodeError are ValueErrors
        return cut, b""
    return len(data), b"\n"


def repair_log(path: str | Path) -> str | None:
    """Make a log end on a whole line before a run appends to it; say what was done (None: nothing to do)."""
    path = Path(path)
    data = path.read_bytes()
    keep, add = tail_repair(data)
    if keep == len(data) and not add:
        return None
    with open(path, "r+b") as f:
        f.truncate(keep)
        f.seek(keep)
        f.write(add)
        f.flush()
        os.fsync(f.fileno())
    if add:
        return f"{path}: its last record had no newline; completed it"
    return f"{path}: cut a torn last line ({len(data) - keep} bytes: an attempt killed while being logged, redone)"
