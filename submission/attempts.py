"""Attempt records and the attempt log (JSONL): what the solver writes, `--resume` reads and the simulator replays.

One record per finished attempt (SPEC section 2): which input and attempt, level, view, seed, cap, how thinking ended,
the grid (or why none), the program and its check, times and token counts, and what the engine measured of itself
meanwhile (accepted drafts, decode rate, preemptions: submission.engine_numbers). The log is appended one line per
record,
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
class GridDetail:
    """The grid line's part of an attempt record (submission.grid.workers.records): attempt 1 of a test input carries
    every field, attempt 2 only `worker`. A field not logged is None and is not written, so the log's `grid_line`
    object has exactly the keys it had as a plain dict (older logs lack the ttt_checkpointing, ttt_oom_retries,
    ttt_skipped, ttt_sequences and ttt_why keys: None here). Unknown keys are refused by name, as AttemptRecord
    refuses unknown fields."""

    worker: int | None = None  # the worker (one per device) that solved the task
    time_limit_s: float | None = None  # the task's time limit
    stage_s: dict[str, float] | None = None  # seconds by stage: ttt, search, rescore
    ttt_steps: int | None = None  # training steps run
    ttt_planned: int | None = None  # training steps planned from the budget
    ttt_checkpointing: bool | None = None  # gradient checkpointing on at the training's end
    ttt_oom_retries: int | None = None  # out-of-memory steps retried with checkpointing
    ttt_skipped: int | None = None  # steps whose sequence did not fit even with checkpointing
    ttt_loss: tuple[float, ...] | None = None  # first and last loss; () without training
    search_steps: int | None = None  # model steps the search ran (after the prompts)
    complete: bool | None = None  # the rescoring finished within the task's limit
    candidates: tuple[dict[str, Any], ...] | None = None  # submission.grid.rescore.Candidate.to_json() of each
    ttt_sequences: int | None = None  # the task's training sequences: the steps a full training runs (issue 45)
    ttt_why: str | None = None  # the training plan's forecast, and why fewer steps ran than sequences if so

    def to_json(self) -> dict[str, Any]:
        out = {}
        for f in fields(self):
            value = getattr(self, f.name)
            if value is not None:
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> GridDetail:
        unknown = set(raw) - {f.name for f in fields(cls)}
        if unknown:
            raise ValueError(f"attempt record: grid_line: unknown fields {sorted(unknown)}")
        values = dict(raw)
        for name in ("ttt_loss", "candidates"):
            if values.get(name) is not None:
                values[name] = tuple(values[name])
        return cls(**values)


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
    # Tool agent (Algorithm 7 line 16, seed ~3466-3468): each program candidate's outputs per test input (checked
    # programs found train-perfect in check order, then the final program), and the weak pool (this input's test
    # output of each other program that ran with one). Empty for one request, whose candidate is its program.
    candidate_outputs: tuple[tuple[Grid | None, ...], ...] = ()
    weak_outputs: tuple[Grid, ...] = ()
    started_s: float = 0.0  # seconds since the run started
    finished_s: float = 0.0
    aborted: bool = False  # stopped by the hard stop or an engine failure
    finish: str = ""  # the engine's finish: "stop", "length", "aborted", "error: ..."
    turns: int = 1  # requests made: more than one only for the tool agent (tokens are their sums)
    turn_tokens: tuple[int, ...] = ()  # tool agent: tokens generated by each turn (sim.agent learns from them)
    tool_tokens: int = 0  # tool agent: tokens of the tool turns the kit wrote into the conversation
    grid_line: GridDetail | None = None  # grid line (submission/grid): worker, candidates, stage seconds
    # What the engine measured of itself while this attempt ran, all its requests together (engine_numbers.to_json:
    # tokens, request-seconds, drafts verified, draft tokens, accepted drafts, preemptions); None: not measured
    engine: dict | None = None

    @property
    def tokens(self) -> int:
        return self.thinking_tokens + self.answer_tokens

    @property
    def program_candidates(self) -> tuple[tuple[Grid | None, ...], ...]:
        return program_candidates(self.train_perfect, self.program_outputs, self.candidate_outputs)

    def outcome(self) -> Outcome:
        return Outcome(self.task_id, self.test_index, self.attempt, self.level, self.natural, self.grid,
                       self.thinking_tokens, self.train_perfect, self.demos_right)

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["level"] = int(self.level)
        out["grid"] = to_json(self.grid) if self.grid is not None else None
        out["program_outputs"] = [to_json(g) if g is not None else None for g in self.program_outputs]
        if self.engine is None:  # records without it stay as they were
            del out["engine"]
        if self.grid_line is None:  # reasoning-line records stay as they were
            del out["grid_line"]
        else:
            out["grid_line"] = self.grid_line.to_json()
        out["candidate_outputs"] = [[to_json(g) if g is not None else None for g in c] for c in self.candidate_outputs]
        out["weak_outputs"] = [to_json(g) for g in self.weak_outputs]
        for name in ("candidate_outputs", "weak_outputs"):
            if not out[name]:  # records without them stay as they were
                del out[name]
        if not self.turn_tokens:  # one request: records stay as they were
            del out["turn_tokens"], out["tool_tokens"]
        else:
            out["turn_tokens"] = list(self.turn_tokens)
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
        values["turn_tokens"] = tuple(raw.get("turn_tokens", ()))
        values["program_outputs"] = tuple(to_grid(g) if g is not None else None for g in raw.get("program_outputs", []))
        values["candidate_outputs"] = tuple(tuple(to_grid(g) if g is not None else None for g in c)
                                            for c in raw.get("candidate_outputs", []))
        values["weak_outputs"] = tuple(to_grid(g) for g in raw.get("weak_outputs", []))
        values["grid_line"] = GridDetail.from_json(raw["grid_line"]) if raw.get("grid_line") is not None else None
        return cls(**values)


def program_candidates(train_perfect: bool, program_outputs: tuple, candidate_outputs: tuple) -> tuple:
    """The outputs (per test input) of each program candidate of an attempt: the tool agent's list, else the
    attempt's program if train-perfect (one request, or a record logged before the list was)."""
    if candidate_outputs:
        return candidate_outputs
    return (program_outputs,) if train_perfect else ()


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
