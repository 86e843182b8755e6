"""Solver faults, injected into real runs of `submission.main` (the replay engine, real ARC tasks, the real sandbox):
a torn log line resumed twice, an old log without --resume, SIGTERM then SIGKILL, a full disk under the answer file,
an engine core killed mid-run (its orphaned worker must be gone before the new engine starts), a restart that fails,
and the watchdog of an in-process run. For each: the run goes on or ends cleanly, no finished attempt is lost or
redone, the answer file is valid and holds every finished attempt's answer, and stderr says what happened."""

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

from submission.answer_file import render_submission
from submission.attempts import AttemptRecord, read_log
from submission.schedule import Level
from submission.selection import Candidates
from submission.tasks import load_tasks

REPO = Path(__file__).resolve().parents[2]
N_TASKS = 4


@pytest.fixture(scope="module")
def setup(arc_data, tmp_path_factory):
    """An earlier run to replay: three attempts per input, some right, each ~0.2-0.6 s (times the scale)."""
    folder = tmp_path_factory.mktemp("faults")
    tasks = load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks[:N_TASKS]
    rng = random.Random(0)
    records = []
    for task in tasks:
        for index, label in enumerate(task.test_outputs):
            for attempt in (1, 2, 3):
                grid = label if rng.random() < 0.4 else ((rng.randrange(1, 10),),)
                records.append(AttemptRecord(task.id, index, attempt, Level(attempt - 1), 0, 4000, natural=True,
                                             thinking_tokens=rng.randint(100, 900), answer_tokens=50, grid=grid,
                                             started_s=0.0, finished_s=rng.uniform(0.2, 0.6)))
    source = folder / "earlier.jsonl"
    source.write_text("".join(json.dumps(r.to_json()) + "\n" for r in records))
    return source, tasks


def solver_args(tmp_path: Path, profile_path: Path, arc_data: Path, *extra: str) -> list[str]:
    return ["--tasks", str(arc_data / "arc-agi-2" / "evaluation"), "--max-tasks", str(N_TASKS), "--out",
            str(tmp_path / "submission.json"), "--profile", str(profile_path), "--log", str(tmp_path / "run.jsonl"),
            *extra]


def solve(args: list[str], script: str | None = None, **kw) -> subprocess.CompletedProcess:
    head = [sys.executable, "-c", script] if script else [sys.executable, "-m", "submission.main"]
    return subprocess.run(head + args, cwd=REPO, capture_output=True, text=True, timeout=300, **kw)


def assert_consistent(tmp_path: Path, tasks, complete: bool = True) -> list[AttemptRecord]:
    """No finished attempt redone (one aborted at a stop is logged as aborted and redone on resume, by design); the
    answer file is exactly what the logged attempts give; with `complete`, every input got its first and second
    attempts."""
    records = read_log(tmp_path / "run.jsonl")
    keys = Counter((r.task_id, r.test_index, r.attempt) for r in records if not r.aborted)
    assert max(keys.values()) == 1, [k for k, n in keys.items() if n > 1]
    candidates = Candidates()
    for record in records:
        candidates.add_record(record)
    counts = {t.id: len(t.test_inputs) for t in tasks}
    expected = render_submission(counts, {key: candidates.answers(key) for key in candidates.by_input})
    assert json.loads((tmp_path / "submission.json").read_text()) == expected
    if complete:
        inputs = {(t.id, i) for t in tasks for i in range(len(t.test_inputs))}
        for level in (Level.FIRST, Level.SECOND):
            assert {(r.task_id, r.test_index) for r in records if r.level is level} == inputs
    return records


def tear_last_line(log: Path) -> None:
    """What a kill in the middle of a log write leaves: the last record cut in half, no newline."""
    data = log.read_bytes()
    last = data.rstrip(b"\n").rfind(b"\n") + 1
    log.write_bytes(data[:last + (len(data) - last) // 2])


def test_a_torn_log_line_is_cut_and_the_log_resumes_twice(setup, arc_data, tmp_path, replay_profile):
    source, tasks = setup
    args = solver_args(tmp_path, replay_profile(tmp_path, source, 0.05), arc_data)
    assert solve(args).returncode == 0
    whole = read_log(tmp_path / "run.jsonl")
    for _ in range(2):  # each resume redoes the torn attempt and appends after a whole line
        tear_last_line(tmp_path / "run.jsonl")
        done = solve(args + ["--resume"])
        assert done.returncode == 0, done.stderr[-2000:]
        assert "cut a torn last line" in done.stderr
        assert read_log(tmp_path / "run.jsonl")[:len(whole) - 1] == whole[:-1]
    assert_consistent(tmp_path, tasks)


def test_a_new_run_refuses_an_existing_log(setup, arc_data, tmp_path, replay_profile):
    source, _ = setup
    args = solver_args(tmp_path, replay_profile(tmp_path, source, 0.05), arc_data)
    assert solve(args).returncode == 0
    before = (tmp_path / "run.jsonl").read_bytes()
    done = solve(args)
    assert done.returncode == 2 and "--resume" in done.stderr and str(tmp_path / "run.jsonl") in done.stderr
    assert (tmp_path / "run.jsonl").read_bytes() == before


def test_sigterm_ends_the_run_cleanly_then_sigkill_and_resume_lose_nothing(setup, arc_data, tmp_path, replay_profile):
    source, tasks = setup
    args = solver_args(tmp_path, replay_profile(tmp_path, source, 1.0), arc_data)
    log = tmp_path / "run.jsonl"
    proc = subprocess.Popen([sys.executable, "-m", "submission.main", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not (log.exists() and len(log.read_text().splitlines()) >= 4):
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        try:
            out, err = proc.communicate(timeout=10)  # Kaggle's grace before SIGKILL
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, err[-2000:]
    assert "SIGTERM" in err and "answered test inputs" in out
    stopped = assert_consistent(tmp_path, tasks, complete=False)
    done = solve(args + ["--resume"])
    assert done.returncode == 0, done.stderr[-2000:]
    assert read_log(log)[:len(stopped)] == stopped
    assert_consistent(tmp_path, tasks)


DISK_FULL = """
import errno, sys
import submission.answer_file as answers
import submission.main as solver

real, calls = answers.write_submission, [0]

def full_disk(path, submission):  # writes 3 to 8 find the disk full; then space comes back
    calls[0] += 1
    if 3 <= calls[0] <= 8:
        raise OSError(errno.ENOSPC, "No space left on device")
    real(path, submission)

answers.write_submission = full_disk
sys.exit(solver.main(sys.argv[1:]))
"""


def test_a_full_disk_under_the_answer_file_loses_no_answer(setup, arc_data, tmp_path, replay_profile):
    source, tasks = setup
    done = solve(solver_args(tmp_path, replay_profile(tmp_path, source, 0.05), arc_data), DISK_FULL)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "No space left on device" in done.stderr and "written again" in done.stderr
    assert "answer-file writes failed: 6" in done.stdout
    assert_consistent(tmp_path, tasks)


LOG_DISK_FULL = """
import errno, os, sys
import submission.attempts as attempts
import submission.main as solver

calls = {"write": 0, "fsync": 0}


class FullDisk:  # the log's `os`: writes 3 and 4 stop half-way, the 6th fsync fails (delayed allocation)
    def __getattr__(self, name):
        return getattr(os, name)

    def write(self, fd, data):
        calls["write"] += 1
        if calls["write"] in (3, 4):
            os.write(fd, bytes(data[:len(data) // 2]))
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.write(fd, data)

    def fsync(self, fd):
        calls["fsync"] += 1
        if calls["fsync"] == 6:
            raise OSError(errno.ENOSPC, "No space left on device")
        return os.fsync(fd)


attempts.os = FullDisk()
sys.exit(solver.main(sys.argv[1:]))
"""


def test_a_full_disk_under_the_log_keeps_it_whole_and_the_run_going(setup, arc_data, tmp_path, replay_profile):
    source, tasks = setup
    args = solver_args(tmp_path, replay_profile(tmp_path, source, 0.05), arc_data)
    done = solve(args, LOG_DISK_FULL)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "attempt log" in done.stderr and "No space left on device" in done.stderr
    assert "log writes failed: 3" in done.stdout
    logged = read_log(tmp_path / "run.jsonl")  # whole lines only: the three half lines were taken back
    assert (tmp_path / "run.jsonl").read_bytes().endswith(b"\n")
    resumed = solve(args + ["--resume"])  # redoes the three unlogged attempts (and what follows from them)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert read_log(tmp_path / "run.jsonl")[:len(logged)] == logged
    assert_consistent(tmp_path, tasks)


CORE_DIES = """
import os, signal, subprocess, sys
import submission.main as solver
from submission.attempts import read_log
from submission.reasoning.engines.base import EngineDead
from submission.reasoning.engines.replay import ReplayEngine

# The engine core runs in a child process with a worker of its own (as vLLM's core and tensor-parallel workers do);
# the worker notices its parent's death only 60 s later, holding its (GPU) memory until then.
CORE = ("import subprocess, sys, time\\n"
        "worker = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\\n"
        "print(worker.pid, flush=True)\\n"
        "time.sleep(600)\\n")
KILL_AFTER, FAIL_RESTART = int(os.environ["KILL_AFTER"]), os.environ.get("FAIL_RESTART") == "1"
KILL_AGAIN = os.environ.get("KILL_AGAIN") == "1"  # the new engine's core dies too, KILL_AFTER attempts later
state = {"starts": 0, "worker": None, "finished": 0}


def alive(pid):
    try:
        return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] not in "ZX"
    except OSError:
        return False


class CoreEngine(ReplayEngine):
    async def start(self):
        state["starts"] += 1
        if state["worker"]:
            print(f"fake engine: the previous worker is {'still alive' if alive(state['worker']) else 'gone'}",
                  file=sys.stderr, flush=True)
        if state["starts"] > 1 and FAIL_RESTART:
            raise RuntimeError("CUDA out of memory (injected)")
        self.core = subprocess.Popen([sys.executable, "-c", CORE], stdout=subprocess.PIPE, text=True)
        state["worker"] = int(self.core.stdout.readline())
        await super().start()

    async def generate(self, request):
        if self.core.poll() is not None:
            raise EngineDead("engine core died")
        completion = await super().generate(request)
        state["finished"] += 1
        if state["finished"] == KILL_AFTER or (KILL_AGAIN and state["finished"] == 2 * KILL_AFTER):
            os.kill(self.core.pid, signal.SIGKILL)  # the OOM killer takes the core mid-run
        return completion

    async def close(self):
        if self.core.poll() is None:
            self.core.kill()
        self.core.wait()
        await super().close()


try:
    code = solver.main(sys.argv[1:], new_engine=lambda p: CoreEngine(read_log(p.engine.model), p.engine,
                                                                     p.engine.replay_time_scale))
finally:
    if state["worker"] and alive(state["worker"]):
        os.kill(state["worker"], signal.SIGKILL)
sys.exit(code)
"""


def test_an_engine_core_killed_mid_run_is_replaced_after_its_workers_are_gone(setup, arc_data, tmp_path,
                                                                              replay_profile):
    source, tasks = setup
    args = solver_args(tmp_path, replay_profile(tmp_path, source, 0.1), arc_data)
    done = solve(args, CORE_DIES, env=dict(os.environ, KILL_AFTER="5"))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "the engine died" in done.stderr and "the dead engine left 1 processes" in done.stderr
    assert "the previous worker is gone" in done.stderr  # its memory was free before the new engine started
    assert "engine restarts: 1" in done.stdout
    assert_consistent(tmp_path, tasks)


def test_a_failed_engine_restart_keeps_every_answer_and_says_so(setup, arc_data, tmp_path, replay_profile):
    source, tasks = setup
    args = solver_args(tmp_path, replay_profile(tmp_path, source, 0.1), arc_data)
    done = solve(args, CORE_DIES, env=dict(os.environ, KILL_AFTER="5", FAIL_RESTART="1"))
    assert done.returncode == 1, done.stderr[-2000:]
    assert "could not be restarted (RuntimeError: CUDA out of memory (injected))" in done.stderr
    assert "answered test inputs" in done.stdout
    assert len(assert_consistent(tmp_path, tasks, complete=False)) >= 5
    resumed = solve(args + ["--resume"])  # the next run (a new process) finishes the job
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_consistent(tmp_path, tasks)


def test_a_second_engine_death_ends_the_run_with_a_failure_status_and_resume_finishes(setup, arc_data, tmp_path,
                                                                                     replay_profile):
    """Issue 27: a second engine death ended the run with status 0, so boot took the run for finished and never
    relaunched it. Now it exits 1 (every answer kept), and a --resume in new processes finishes the job."""
    source, tasks = setup
    args = solver_args(tmp_path, replay_profile(tmp_path, source, 0.1), arc_data)
    done = solve(args, CORE_DIES, env=dict(os.environ, KILL_AFTER="3", KILL_AGAIN="1"))
    assert done.returncode == 1, done.stderr[-2000:]
    assert "the engine died again after its restart: stopping with the answers so far" in done.stderr
    assert len(assert_consistent(tmp_path, tasks, complete=False)) >= 6
    resumed = solve(args + ["--resume"])
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert_consistent(tmp_path, tasks)


NEVER_STARTS = """
import sys
import submission.main as solver
from submission.attempts import read_log
from submission.reasoning.engines.replay import ReplayEngine


class NeverStarts(ReplayEngine):
    async def start(self):
        raise RuntimeError("CUDA out of memory (injected at the engine start)")


sys.exit(solver.main(sys.argv[1:], new_engine=lambda p: NeverStarts(read_log(p.engine.model), p.engine,
                                                                   p.engine.replay_time_scale)))
"""


def test_a_resume_writes_the_logged_answers_before_its_engine_starts(setup, arc_data, tmp_path, replay_profile):
    """Issue 27: --resume wrote a [[0]] answer file and restored the log only after the engine had started (minutes
    on a GPU); a relaunch that died or was stopped in its engine start left every answer of the earlier run out of
    the file. Now the log's answers are in the file before the engine starts."""
    source, tasks = setup
    args = solver_args(tmp_path, replay_profile(tmp_path, source, 0.05), arc_data)
    assert solve(args).returncode == 0
    answers = (tmp_path / "submission.json").read_text()
    done = solve(args + ["--resume"], NEVER_STARTS)
    assert done.returncode == 1 and "CUDA out of memory (injected at the engine start)" in done.stderr
    assert (tmp_path / "submission.json").read_text() == answers
    assert_consistent(tmp_path, tasks)


IN_PROCESS = """
import time
import submission.main as solver


def test_solver_in_process():
    assert solver.main({args!r}) == 0


def test_later_file():  # outlives the solver's watchdog (3.5 s) and its SIGALRM (5 s)
    time.sleep(7)
"""


def test_an_in_process_run_never_meets_the_watchdog(setup, arc_data, tmp_path, replay_profile):
    """The scaled-down `make test`: a test file calls the solver in-process and later tests keep running; pytest's
    summary must be the last line (the watchdog used to exit 0 in the middle, with no summary)."""
    source, _ = setup
    args = solver_args(tmp_path, replay_profile(tmp_path, source, 0.05), arc_data, "--deadline", "6",
                       "--scale-schedule")
    (tmp_path / "test_in_process.py").write_text(IN_PROCESS.format(args=args))
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           str(tmp_path / "test_in_process.py")], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    last = done.stdout.strip().splitlines()[-1]
    assert done.returncode == 0 and last.startswith("2 passed"), done.stdout[-2000:] + done.stderr[-2000:]


CLOCK_JUMP = """
import sys, time
import submission.main as solver

real, calls, stamps = time.time, [0], [0]

def jumping():  # the wall clock jumps two hours ahead after a few reads, then two hours back (NTP, a VM resumed)
    if sys._getframe(1).f_code.co_filename.endswith("heartbeat.py"):
        stamps[0] += 1  # the heartbeat's `time`, for people reading the file: no deadline, no supervisor reads it
    else:
        calls[0] += 1
    return real() + (7200 if 20 <= calls[0] + stamps[0] < 60 else -7200 if calls[0] + stamps[0] >= 60 else 0)

time.time = jumping
code = solver.main(sys.argv[1:])
print(f"wall-clock reads: {calls[0]}, heartbeat stamps: {stamps[0]}", file=sys.stderr)
sys.exit(code)
"""


def test_a_wall_clock_jump_changes_nothing(setup, arc_data, tmp_path, replay_profile):
    """A jump of the wall clock (NTP, a resumed VM) cannot move a deadline: the solver counts every deadline on
    time.monotonic and never reads time.time during a run, which this run checks with a wall clock that would jump
    two hours either way had it been read (the heartbeat's informational `time` stamp aside: it reads the jumping
    clock, and nothing reads the stamp back). (A survived fault: it passes on the code before issue 15 too.)"""
    source, tasks = setup
    started = time.monotonic()
    done = solve(solver_args(tmp_path, replay_profile(tmp_path, source, 0.05), arc_data), CLOCK_JUMP)
    assert done.returncode == 0, done.stderr[-2000:]
    assert int(done.stderr.split("wall-clock reads: ")[1].split(",")[0]) == 0  # nothing could see the jumps
    assert int(done.stderr.split("heartbeat stamps: ")[1].split()[0]) > 0
    assert time.monotonic() - started < 120
    assert_consistent(tmp_path, tasks)
