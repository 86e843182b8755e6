"""Run a candidate program's `transform(grid)` on every demonstration and test input, isolated, and judge it.

    python -m submission.sandbox --program P.py --task T.json [--cpu-s 10] [--memory-mb 1024] [--wall-s 15]

Prints a JSON report: the active isolation layers, one record per pair (right, wrong, produced, invalid, error,
timeout, crash), `train_perfect` and the test outputs. What the isolation covers and what it does not is stated in
`submission/sandbox_server.py`; `Sandbox.layers` says which layers are active on this machine.

`Sandbox` keeps one warm server process (numpy imported, BLAS threads 1) that forks a child per check; it is
thread-safe (one check at a time per instance: make several for parallel checks) and restarts its server if the server
dies, reporting that check as a crash. Judging (`judge`) is pure.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import selectors
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path

from submission.grids import Grid, to_grid, to_json
from submission.tasks import Task, load_tasks

SERVER = Path(__file__).with_name("sandbox_server.py")


@dataclass(frozen=True)
class SandboxLimits:
    """Per-check limits. CPU covers the whole check (all pairs); the wall clock must exceed it (sleeping programs)."""

    cpu_s: int = 10
    memory_mb: int = 1024
    wall_s: float = 15.0
    max_result_bytes: int = 1 << 20  # the child's JSON lines; 30x30 grids need ~2 KB each

    def __post_init__(self) -> None:
        if self.cpu_s < 1 or self.memory_mb < 64 or self.wall_s <= self.cpu_s:
            raise ValueError(f"sandbox limits: need cpu_s >= 1, memory_mb >= 64, wall_s > cpu_s; got {self}")


class Status(str, Enum):
    RIGHT = "right"  # valid grid equal to the known output
    WRONG = "wrong"  # valid grid, different from the known output
    PRODUCED = "produced"  # valid grid, no known output to compare (a hidden test input)
    INVALID = "invalid"  # returned something that is not a grid (message says why)
    ERROR = "error"  # raised (error_type and message say what)
    TIMEOUT = "timeout"  # CPU or wall-clock limit
    CRASH = "crash"  # died without a result: signal, os._exit, result too large, server died


@dataclass(frozen=True)
class PairResult:
    status: Status
    output: Grid | None = None
    error_type: str | None = None
    message: str | None = None


@dataclass(frozen=True)
class CheckResult:
    train: tuple[PairResult, ...]
    test: tuple[PairResult, ...]
    cpu_s: float
    wall_s: float

    @property
    def train_perfect(self) -> bool:
        return all(p.status is Status.RIGHT for p in self.train)

    @property
    def test_outputs(self) -> tuple[Grid | None, ...]:
        return tuple(p.output for p in self.test)

    def to_json(self) -> dict:
        def pair(p: PairResult) -> dict:
            d = asdict(p)
            d["status"] = p.status.value
            d["output"] = to_json(p.output) if p.output is not None else None
            return d

        return {"train_perfect": self.train_perfect, "train": [pair(p) for p in self.train],
                "test": [pair(p) for p in self.test], "cpu_s": self.cpu_s, "wall_s": self.wall_s}


def _pair(raw: dict, expected: Grid | None) -> PairResult:
    status = raw.get("status")
    if status == "ok":
        grid = to_grid(raw["output"])
        verdict = Status.PRODUCED if expected is None else Status.RIGHT if grid == expected else Status.WRONG
        return PairResult(verdict, grid)
    return PairResult(Status(status), None, raw.get("error_type"), raw.get("message"))


def judge(raw_outputs: list[dict], train_outputs: tuple[Grid, ...], test_outputs: tuple[Grid | None, ...],
          cpu_s: float = 0.0, wall_s: float = 0.0) -> CheckResult:
    """Turn the server's per-input records into a typed CheckResult against the known outputs. Pure."""
    expected = list(train_outputs) + list(test_outputs)
    if len(raw_outputs) != len(expected):
        raise ValueError(f"{len(raw_outputs)} results for {len(expected)} inputs")
    pairs = [_pair(raw, want) for raw, want in zip(raw_outputs, expected)]
    n = len(train_outputs)
    return CheckResult(tuple(pairs[:n]), tuple(pairs[n:]), cpu_s, wall_s)


class SandboxError(RuntimeError):
    """The server could not be started at all."""


class Sandbox:
    """A warm sandbox server; use as a context manager or call close()."""

    def __init__(self, limits: SandboxLimits = SandboxLimits(), seccomp: bool = True, start_timeout_s: float = 60.0):
        self.limits = limits
        self.seccomp = seccomp  # False only to test the fallback layers
        self.start_timeout_s = start_timeout_s
        self.layers: dict[str, object] = {}
        self.restarts = 0
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._start()

    def _start(self) -> None:
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   NUMEXPR_NUM_THREADS="1", ARC_SANDBOX_SECCOMP="1" if self.seccomp else "0")
        self._proc = subprocess.Popen([sys.executable, "-I", str(SERVER)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                      start_new_session=True)
        hello = self._read_line(self.start_timeout_s)
        if hello is None or not hello.get("ready"):
            self._kill()
            raise SandboxError(f"sandbox server {SERVER} did not start (got {hello!r})")
        self.layers = hello["layers"]

    def _read_line(self, timeout_s: float) -> dict | None:
        assert self._proc is not None and self._proc.stdout is not None
        with selectors.DefaultSelector() as sel:
            sel.register(self._proc.stdout, selectors.EVENT_READ)
            if not sel.select(timeout_s):
                return None
        line = self._proc.stdout.readline()
        return json.loads(line) if line else None

    def _kill(self) -> None:
        if self._proc is None:
            return
        try:
            os.killpg(self._proc.pid, signal.SIGKILL)
        except OSError:
            pass
        self._proc.wait()
        for stream in (self._proc.stdin, self._proc.stdout):
            if stream:
                stream.close()
        self._proc = None

    def run(self, program: str, inputs: list[Grid]) -> tuple[list[dict], float, float]:
        """The raw per-input records for a program on some grids, with CPU and wall seconds."""
        request = {"program": program, "inputs": inputs,  # json writes the grids' tuples as lists
                   "limits": {"cpu_s": self.limits.cpu_s, "memory_bytes": self.limits.memory_mb << 20,
                              "wall_s": self.limits.wall_s, "max_result_bytes": self.limits.max_result_bytes}}
        with self._lock:
            if self._proc is None:
                self._start()
                self.restarts += 1
            assert self._proc is not None and self._proc.stdin is not None
            started = time.monotonic()
            try:
                self._proc.stdin.write(json.dumps(request).encode() + b"\n")
                self._proc.stdin.flush()
                reply = self._read_line(self.limits.wall_s + 10)
            except (BrokenPipeError, json.JSONDecodeError, OSError):
                reply = None
            if reply is None or "outputs" not in reply:
                why = reply.get("server_error", "") if reply else "no reply"
                self._kill()  # restarted on the next check
                crash = {"status": "crash", "message": f"sandbox server died ({why.strip()[-200:]})"}
                return [crash] * len(inputs), 0.0, time.monotonic() - started
            return reply["outputs"], reply["cpu_s"], reply["wall_s"]

    def check(self, program: str, task: Task) -> CheckResult:
        """Run `program` on every demonstration input and every test input of `task`, judged against its outputs."""
        inputs = [p.input for p in task.train] + list(task.test_inputs)
        raw, cpu, wall = self.run(program, inputs)
        labels = task.test_outputs or (None,) * len(task.test_inputs)
        return judge(raw, tuple(p.output for p in task.train), labels, cpu, wall)

    def close(self) -> None:
        with self._lock:
            if self._proc is not None and self._proc.stdin is not None:
                try:
                    self._proc.stdin.close()
                    self._proc.wait(timeout=5)
                except (OSError, subprocess.TimeoutExpired):
                    pass
            self._kill()

    def __enter__(self) -> Sandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m submission.sandbox", description=__doc__.split("\n\n")[0])
    parser.add_argument("--program", required=True, type=Path, help="a Python file defining transform(grid)")
    parser.add_argument("--task", required=True, type=Path, help="a task JSON file (test outputs optional)")
    parser.add_argument("--cpu-s", type=int, default=SandboxLimits.cpu_s)
    parser.add_argument("--memory-mb", type=int, default=SandboxLimits.memory_mb)
    parser.add_argument("--wall-s", type=float, default=SandboxLimits.wall_s)
    args = parser.parse_args(argv)
    tasks = load_tasks(args.task)
    if tasks.errors or len(tasks.tasks) != 1:
        print(f"error: {'; '.join(map(str, tasks.errors)) or f'{args.task}: expected one task'}", file=sys.stderr)
        return 2
    try:
        program = args.program.read_text()
    except OSError as err:
        print(f"error: {args.program}: {err}", file=sys.stderr)
        return 2
    with Sandbox(SandboxLimits(args.cpu_s, args.memory_mb, args.wall_s)) as box:
        result = box.check(program, tasks.tasks[0])
        report = json.dumps({"task": tasks.tasks[0].id, "layers": box.layers, **result.to_json()}, indent=1)
        print(re.sub(r"\[\s+([\d,\s]+?)\s+\]", lambda m: "[" + "".join(m.group(1).split()).replace(",", ", ") + "]", report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
