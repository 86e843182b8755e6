"""Run a candidate program's `transform(grid)` on every demonstration and test input, isolated, and judge it.

    python -m submission.sandbox --program P.py --task T.json [--cpu-s 10] [--memory-mb 1024] [--wall-s 15]

Prints a JSON report: the active isolation layers, one record per pair (right, wrong, produced, invalid, error,
timeout, crash), `train_perfect` and the test outputs. What the isolation covers and what it does not is stated in
`submission/sandbox/server.py`; `Sandbox.layers` says which layers are active on this machine.

`Sandbox` keeps one warm server process (numpy imported, BLAS threads 1) that forks a child per check; it is
thread-safe (one check at a time per instance: make several for parallel checks). A server that died between checks
(OOM killer, a signal) is replaced before the next check, which then runs normally; one that dies during a check is
replaced too, and that check reports a crash. No check raises for a dead or unstartable server. The server lives as
long as the owning process (not the thread that created it) and leaves no folder behind. Judging (`judge`) is pure.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Callable

from submission.grids import Grid, GridError, from_cells, to_cells, to_json
from submission.tasks import Task, load_tasks

SERVER = Path(__file__).with_name("server.py")


@dataclass(frozen=True)
class SandboxLimits:
    """Per-check limits. CPU time is the budget and covers the whole check (all pairs). The wall clock stops programs
    that sleep or block: it must exceed the CPU budget and it does not count time spent waiting for a CPU, so an honest
    program on a busy machine is not cut short; `backstop_s` bounds a check's wall time however starved it is."""

    cpu_s: int = 10
    memory_mb: int = 1024
    wall_s: float = 15.0  # wall clock less time waiting for a CPU (/proc/PID/schedstat)
    max_result_bytes: int = 1 << 20  # the child's JSON lines; 30x30 grids need ~2 KB each
    backstop_s: float = 60.0  # plain wall clock, whatever the contention

    def __post_init__(self) -> None:
        if self.cpu_s < 1 or self.memory_mb < 64 or self.wall_s <= self.cpu_s or self.backstop_s < self.wall_s:
            raise ValueError("sandbox limits: need cpu_s >= 1, memory_mb >= 64, wall_s > cpu_s, backstop_s >= wall_s;"
                             f" got {self}")


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


_REPORTED = {"invalid", "error", "timeout", "crash"}  # what a result line may say besides "ok"


def _pair(raw: dict, expected: Grid | None) -> PairResult:
    status = raw.get("status")
    if status == "ok":
        try:
            grid = from_cells(raw["output"])
        except (GridError, KeyError) as err:  # the result pipe is writable by the program: never trust its bytes
            return PairResult(Status.INVALID, None, type(err).__name__, f"malformed result line: {err}"[:400])
        verdict = Status.PRODUCED if expected is None else Status.RIGHT if grid == expected else Status.WRONG
        return PairResult(verdict, grid)
    if status not in _REPORTED:
        return PairResult(Status.INVALID, None, None, f"malformed result line: status {status!r:.40}")
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


@functools.lru_cache(maxsize=64)
def _encoded_grids(grids: tuple[Grid, ...]) -> bytes:
    """A task's inputs in the wire form (`submission.grids.to_cells`), as a JSON list, encoded once: a solver checks
    many programs against the same task (encoding was the largest cost of a check in the caller; cProfile, issue 20)."""
    return json.dumps([to_cells(g) for g in grids]).encode()


class SandboxError(RuntimeError):
    """The server could not be started at all."""


def _say(message: str) -> None:
    print(f"sandbox: {message}", file=sys.stderr, flush=True)


def _exit_text(returncode: int | None) -> str:
    if returncode is None:
        return "still running"
    if returncode < 0:
        return f"killed by {signal.Signals(-returncode).name}"
    return f"exited with code {returncode}"


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

    @property
    def server_pid(self) -> int | None:
        """The server's process id (None between a death and the next check)."""
        return self._proc.pid if self._proc is not None else None

    def _start(self) -> None:
        env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1", MKL_NUM_THREADS="1",
                   NUMEXPR_NUM_THREADS="1", ARC_SANDBOX_SECCOMP="1" if self.seccomp else "0")
        limits = {"cpu_s": self.limits.cpu_s, "memory_bytes": self.limits.memory_mb << 20,
                  "wall_s": self.limits.wall_s, "backstop_s": self.limits.backstop_s,
                  "max_result_bytes": self.limits.max_result_bytes}
        self._proc = subprocess.Popen([sys.executable, "-I", str(SERVER), json.dumps(limits)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env,
                                      start_new_session=True)
        hello = self._read_line(self.start_timeout_s)
        if hello is None or not hello.get("ready"):
            self._kill()
            raise SandboxError(f"sandbox server {SERVER} did not start (got {hello!r})")
        self.layers = hello["layers"]

    def _read_line(self, timeout_s: float) -> dict | None:
        assert self._proc is not None and self._proc.stdout is not None
        poller = select.poll()  # one syscall per wait (a selector opens and closes an epoll fd); any fd number
        poller.register(self._proc.stdout, select.POLLIN)
        if not poller.poll(timeout_s * 1000):
            return None
        line = self._proc.stdout.readline()
        return json.loads(line) if line else None

    def _kill(self) -> None:
        """Kill and reap the server; never raises (its pipes may already be broken)."""
        proc, self._proc = self._proc, None
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        for stream in (proc.stdin, proc.stdout):
            try:
                if stream:
                    stream.close()
            except OSError:
                pass  # BrokenPipeError flushing into a dead server

    def _ensure_server(self) -> str | None:
        """A live server for the next check: a dead one (killed between checks) is replaced. None, or why not."""
        if self._proc is not None and self._proc.poll() is not None:
            _say(f"the server (pid {self._proc.pid}) died between checks ({_exit_text(self._proc.returncode)}): "
                 "starting a new one")
            self._kill()
        if self._proc is None:
            try:
                self._start()
            except (SandboxError, OSError) as err:
                return f"sandbox server could not be restarted: {err}"
            self.restarts += 1
        return None

    def _exchange(self, data: bytes) -> tuple[dict | None, bool]:
        """Send one request and read its reply: (reply or None, whether the request was delivered)."""
        assert self._proc is not None and self._proc.stdin is not None
        try:
            self._proc.stdin.write(data)
            self._proc.stdin.flush()
        except OSError:  # BrokenPipeError: it died before reading the request
            return None, False
        try:
            return self._read_line(self.limits.backstop_s + 10), True
        except (json.JSONDecodeError, OSError):
            return None, True

    def _exit_reason(self) -> str:
        """Why the server stopped answering: its exit, once it is reaped (its pipe closes just before)."""
        assert self._proc is not None
        try:
            return _exit_text(self._proc.wait(timeout=1))
        except subprocess.TimeoutExpired:
            return "no reply"

    def run(self, program: str, inputs: list[Grid]) -> tuple[list[dict], float, float]:
        """The raw per-input records for a program on some grids, with CPU and wall seconds. Never raises for the
        server's death: a check it could not run reports every input as a crash."""
        data = b'{"program": ' + json.dumps(program).encode() + b', "inputs": ' + _encoded_grids(tuple(inputs)) + b"}\n"
        with self._lock:
            started = time.monotonic()
            for _ in range(2):  # a request the server never received is sent once more to a new server
                why = self._ensure_server()
                if why is not None:
                    break
                reply, delivered = self._exchange(data)
                if reply is not None and "outputs" in reply:
                    return reply["outputs"], reply["cpu_s"], reply["wall_s"]
                why = reply.get("server_error", "").strip()[-200:] if reply else self._exit_reason()
                self._kill()  # replaced before the next check
                if delivered:
                    _say(f"the server failed during a check ({why}): reported as a crash, replaced before the next")
                    break
            crash = {"status": "crash", "message": f"sandbox server died ({why})"}
            return [crash] * len(inputs), 0.0, time.monotonic() - started

    def check(self, program: str, task: Task) -> CheckResult:
        """Run `program` on every demonstration input and every test input of `task`, judged against its outputs."""
        inputs = [p.input for p in task.train] + list(task.test_inputs)
        raw, cpu, wall = self.run(program, inputs)
        labels = task.test_outputs or (None,) * len(task.test_inputs)
        return judge(raw, tuple(p.output for p in task.train), labels, cpu, wall)

    def close(self) -> None:
        """End the server: its stdin closes, it discards its spare child and exits. Never raises."""
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


def exit_quietly_on_closed_pipe(main: Callable[[], int]) -> int:
    """Run a command whose reader may stop early (`| head`): a closed stdout ends it quietly, not with a
    BrokenPipeError traceback."""
    try:
        code = main()
        sys.stdout.flush()
        return code
    except BrokenPipeError:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the flush at exit must not fail again
        return 0


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
    try:
        limits = SandboxLimits(args.cpu_s, args.memory_mb, args.wall_s,
                               backstop_s=max(SandboxLimits.backstop_s, 4 * args.wall_s))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    with Sandbox(limits) as box:
        result = box.check(program, tasks.tasks[0])
        report = json.dumps({"task": tasks.tasks[0].id, "layers": box.layers, **result.to_json()}, indent=1)
        print(re.sub(r"\[\s+([\d,\s]+?)\s+\]", lambda m: "[" + "".join(m.group(1).split()).replace(",", ", ") + "]", report))
    return 0


if __name__ == "__main__":
    sys.exit(exit_quietly_on_closed_pipe(main))
