"""Boot's supervisor: a solver that crashes, hangs or never finishes its engine start is relaunched with `--resume`,
so one fault does not end the useful part of the 12-hour rerun.

    status = supervise(command, "--resume", cwd, env, timeout, heartbeat_path, SuperviseConfig())

Without it, a solver crash, a second engine death (exit 1) or a hang ended the rerun's work: boot waited for its exit
or its watchdog, and the hours left were spent for nothing. The solver's log is the truth (every finished attempt
appended and fsynced) and `--resume` restores every finished attempt without redoing it, so a relaunch loses nothing
already answered: it costs one engine start.

What counts as what (the policy, pure: `observe` folds what the shell sees into a `Life`, `decide` turns the life
into an `Action`, the clock passed in; tested without processes):
- an abnormal exit: any status but 0, 2 (arguments refused: a relaunch would be refused too) and 143 or -15 after
  a SIGTERM boot itself sent (`until`, or boot's own SIGTERM passed on). A 143 nobody here asked for is abnormal.
- a hang: the heartbeat (submission/heartbeat.py) in phase "solving" with work queued or running, and no progress for
  `hang_s` (or the solver's own `quiet_s`, when longer: the grid line's longest task). Progress is any change of
  attempts finished, engine tokens or phase, as this process sees the heartbeat; a solver whose heartbeat stops
  changing (an event loop stuck, a frozen engine) reads the same as one that reports no progress.
- an endless engine start: from the launch (or from a mid-run engine restart seen in the heartbeat) to phase
  "solving" longer than `engine_start_s`. A solver that writes no heartbeat at all counts as never started; with
  `heartbeat_path=None` only exits are watched.
- a relaunch comes `restart_spacing_s` after the death (the GPU driver frees a killed process's memory; no crash
  loop), at most `max_restarts` times, each logged with its cause, and only while the time left covers an engine
  start (the longest seen in this run, else `engine_start_s`) plus `min_solve_s` of solving: a relaunch that could
  not finish an attempt is not made (it would do no harm: the answer file is restored before its engine starts,
  and its deadline ends it). When no relaunch may follow, a hung or slow-starting solver is left running to its own
  deadline (a false alarm then costs nothing) and a dead one's status is returned.

The shell starts the solver in its own session (so a hung one is ended with its whole process group: SIGTERM to the
solver for its own orderly stop, SIGKILL to the group after `kill_grace_s`), makes this process a child subreaper
(Linux) so that what the solver left outside its group (an engine worker orphaned by its dying core, holding GPU
memory; the sandbox server, in its own session) comes back here and is ended and reaped before a relaunch, and
passes a SIGTERM it receives on to the solver (in its own session the solver no longer gets its group's signals).
Each relaunch gets `--resume` once and, when the command has `--deadline`, the deadline less the time gone by.
Exit semantics: 0 when the last solver exited 0, or 143 / -15 after boot's own SIGTERM; otherwise the last solver's
status (negative: the signal that killed it); `subprocess.TimeoutExpired` once `timeout` has passed (the solver's
group killed and its leftovers ended first). Not covered: this process itself killed (SIGKILL) leaves the solver
running to its own deadline; leftovers of the solver outside this process's tree on a system without subreapers.
Standard library only: boot runs it before its environment is installed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from submission.heartbeat import Heartbeat, HeartbeatError, read
from submission.processes import become_subreaper, descendants, end_processes, leftovers

POLL_S = 0.5  # how often the shell looks at the solver and its heartbeat


@dataclass(frozen=True)
class SuperviseConfig:
    hang_s: float = 1800.0  # no attempt finished and no token generated this long, with work queued: a hang
    engine_start_s: float = 3600.0  # launch (or an engine restart) to phase "solving" longer than this: stuck
    max_restarts: int = 3  # relaunches at most, whatever their causes
    restart_spacing_s: float = 30.0  # a relaunch comes this long after the death
    min_solve_s: float = 600.0  # a relaunch must leave this long of solving after its engine start
    kill_grace_s: float = 30.0  # SIGTERM to the solver, then SIGKILL to its process group this long after

    def __post_init__(self) -> None:
        for name in ("hang_s", "engine_start_s", "restart_spacing_s", "min_solve_s", "kill_grace_s"):
            if getattr(self, name) < 0:
                raise ValueError(f"supervise: {name} must not be negative (got {getattr(self, name)})")
        if self.max_restarts < 0:
            raise ValueError(f"supervise: max_restarts must not be negative (got {self.max_restarts})")


@dataclass(frozen=True)
class Life:
    """What the shell has seen of one launch of the solver (times on the shell's monotonic clock)."""

    launched_at: float
    starting_at: float | None = None  # when its current engine start began (launch, or a restart seen); None: solving
    heartbeat: Heartbeat | None = None  # the last one read
    progress_at: float | None = None  # the last change of attempts, engine tokens or phase (None: the launch)
    start_s: float | None = None  # how long its engine start took (launch to "solving"), once done
    exit_code: int | None = None  # None while it runs
    ended_at: float | None = None
    asked_to_stop: bool = False  # boot sent it SIGTERM to end the run (`until`, or boot's own SIGTERM)
    killed_for: str = ""  # why boot is ending it to relaunch it (a hang, an endless engine start)


@dataclass(frozen=True)
class Action:
    kind: str  # "wait"; "restart" (a live solver is ended first); "give-up" (no relaunch; a live one runs on); "done"
    reason: str = ""


WAIT = Action("wait")


def launched(now: float) -> Life:
    return Life(launched_at=now, starting_at=now)


def observe(life: Life, now: float, beat: Heartbeat | None) -> Life:
    """`life` after reading `beat` (None: nothing readable) at `now`. Pure."""
    previous = life.heartbeat
    if beat is None or beat == previous:
        return life
    changes: dict = {"heartbeat": beat}
    if previous is None or (beat.phase, beat.attempts, beat.engine_tokens) != (
            previous.phase, previous.attempts, previous.engine_tokens):
        changes["progress_at"] = now
    solving = beat.phase in ("solving", "done")
    if solving and life.starting_at is not None:
        changes["starting_at"] = None
        changes["start_s"] = max(life.start_s or 0.0, now - life.starting_at)
    elif not solving and life.starting_at is None:  # an engine restart in the middle of the run
        changes["starting_at"] = now
    return replace(life, **changes)


def exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with status {code}"


def trouble(config: SuperviseConfig, now: float, life: Life) -> str:
    """Why a live solver should be ended ("" when it should not): an endless engine start, or a hang. Pure."""
    beat = life.heartbeat
    if life.starting_at is not None and now - life.starting_at > config.engine_start_s:
        return (f"its engine start took over {config.engine_start_s:.0f} s (phase: "
                f"{beat.phase if beat else 'no heartbeat yet'})")
    if beat is not None and beat.phase == "solving" and beat.queued + beat.running > 0:
        quiet = now - (life.progress_at if life.progress_at is not None else life.launched_at)
        if quiet > max(config.hang_s, beat.quiet_s):
            return (f"a hang: no attempt finished and no token generated for {quiet:.0f} s ({beat.queued} queued, "
                    f"{beat.running} running)")
    return ""


def no_relaunch(config: SuperviseConfig, restarts: int, time_left: float, start_seen_s: float | None) -> str:
    """Why no relaunch may follow ("" when one may): too many already, or too little time left. Pure."""
    if restarts >= config.max_restarts:
        return f"{restarts} relaunches already, the most allowed (max_restarts)"
    start = config.engine_start_s if start_seen_s is None else min(start_seen_s, config.engine_start_s)
    needed = start + config.min_solve_s
    if time_left < needed:
        return (f"only {max(time_left, 0):.0f} s left, and a relaunch needs {needed:.0f} s (an engine start of "
                f"{start:.0f} s, then {config.min_solve_s:.0f} s of solving)")
    return ""


def decide(config: SuperviseConfig, now: float, life: Life, restarts: int, time_left: float,
           start_seen_s: float | None = None) -> Action:
    """What to do about the solver's current `life`, with `restarts` relaunches made so far, `time_left` seconds of
    the supervisor's timeout and the longest engine start seen in this run (`start_seen_s`). Pure."""
    if life.exit_code is not None:
        code = life.exit_code
        if code == 0 or (life.asked_to_stop and code in (128 + signal.SIGTERM, -signal.SIGTERM)):
            return Action("done", exit_text(code) + (" after boot's SIGTERM" if life.asked_to_stop else ""))
        if life.asked_to_stop:
            return Action("give-up", f"the solver {exit_text(code)} after boot's SIGTERM")
        if code == 2:
            return Action("give-up", "the solver refused its arguments (status 2): a relaunch would be refused too")
        cause = life.killed_for or f"the solver {exit_text(code)}"
        wait_s = max(0.0, (life.ended_at if life.ended_at is not None else now) + config.restart_spacing_s - now)
        why_not = no_relaunch(config, restarts, time_left - wait_s, start_seen_s)
        if why_not:
            return Action("give-up", f"{cause}; no relaunch: {why_not}")
        return WAIT if wait_s > 0 else Action("restart", cause)
    if life.asked_to_stop or life.killed_for:
        return WAIT  # being ended
    problem = trouble(config, now, life)
    if not problem:
        return WAIT
    why_not = no_relaunch(config, restarts, time_left, start_seen_s)
    if why_not:
        return Action("give-up", f"{problem}; no relaunch ({why_not}): it runs on to its own deadline")
    return Action("restart", problem)


def relaunch_command(command: Sequence[str], resume_flag: str, elapsed: float,
                     deadline_flag: str = "--deadline") -> list[str]:
    """`command` with `resume_flag` appended once and its `deadline_flag` value (seconds from launch) less
    `elapsed`, the seconds since the first launch. Pure."""
    out = list(command)
    if deadline_flag in out[:-1]:
        i = out.index(deadline_flag) + 1
        try:
            out[i] = f"{float(out[i]) - elapsed:.1f}"
        except ValueError:
            pass
    if resume_flag not in out:
        out.append(resume_flag)
    return out


def _read_beat(path: Path | None) -> Heartbeat | None:
    if path is None:
        return None
    try:
        return read(path)
    except (OSError, HeartbeatError):  # not written yet, or torn by an in-place write: the next read will tell
        return None


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _our_leftovers(spare: set[int]) -> set[int]:
    try:
        return leftovers(os.getpid(), spare)
    except OSError:  # no /proc: nothing to sweep
        return set()


def _sweep(pgid: int, spare: set[int], grace_s: float, log: Callable[[str], object]) -> None:
    """End what the solver left: its process group, and every process under this one that was not here before
    (re-parented here as its subreaper), reaping them."""
    _kill_group(pgid, signal.SIGTERM)
    left = _our_leftovers(spare)
    if left:
        try:
            killed = end_processes(left, grace_s)
            log(f"supervise: ended {len(left)} processes the solver left ({killed} needed SIGKILL)")
        except RuntimeError as err:  # unkillable (uninterruptible sleep in a driver): say so, go on
            log(f"supervise: {err}")
    _kill_group(pgid, signal.SIGKILL)


def _print(message: str) -> None:
    print(message, flush=True)


def supervise(command: Sequence[str], resume_flag: str, cwd: str | Path, env: dict, timeout: float,
              heartbeat_path: str | Path | None, config: SuperviseConfig = SuperviseConfig(),
              until: Callable[[], bool] | None = None, log: Callable[[str], object] = _print,
              deadline_flag: str = "--deadline") -> int:
    """Run `command` (the solver) under supervision (module doc) and return its exit status: 0 when it ended
    well, else the last solver's status; raises subprocess.TimeoutExpired after `timeout` seconds. `until`: once it
    returns true the solver is ended by SIGTERM (and 143 or -15 then counts as 0); it may print why."""
    begun = time.monotonic()
    heartbeat = Path(heartbeat_path) if heartbeat_path is not None else None
    try:
        spare = descendants(os.getpid())  # a caller's own children (a test's) are never swept
    except OSError:
        spare = set()
    become_subreaper()
    terminated: list[int] = []
    try:
        previous_handler = signal.signal(signal.SIGTERM, lambda *_: terminated.append(1))
        handler_set = True
    except ValueError:  # not the main thread: SIGTERM keeps its handler
        previous_handler, handler_set = None, False
    restarts, start_seen = 0, None
    current = list(command)
    process = None
    try:
        while True:
            if heartbeat is not None:
                try:
                    heartbeat.unlink(missing_ok=True)  # an earlier life's heartbeat is not this one's
                except OSError:
                    pass
            process = subprocess.Popen(current, cwd=cwd, env=env, start_new_session=True)
            life, gave_up, kill_at = launched(time.monotonic()), False, None
            while True:
                now = time.monotonic()
                code = process.poll() if life.exit_code is None else life.exit_code
                if code is None and now - begun > timeout:
                    log(f"supervise: the solver did not end within {timeout:.0f} s: killing it")
                    raise subprocess.TimeoutExpired(current, timeout)  # the `finally` below kills and sweeps
                if code is not None and life.exit_code is None:
                    life = replace(life, exit_code=code, ended_at=now)
                    _sweep(process.pid, spare, config.kill_grace_s, log)
                elif code is None:
                    life = observe(life, now, _read_beat(heartbeat))
                    if life.start_s is not None:
                        start_seen = max(start_seen or 0.0, life.start_s)
                    if not life.asked_to_stop and (terminated or (until is not None and until())):
                        if terminated:
                            log("supervise: boot got SIGTERM: passing it on to the solver")
                        process.send_signal(signal.SIGTERM)
                        life = replace(life, asked_to_stop=True)
                    if kill_at is not None and now >= kill_at:
                        _kill_group(process.pid, signal.SIGKILL)
                        kill_at = float("inf")
                    if gave_up:  # no relaunch will come: it runs to its own end
                        time.sleep(POLL_S)
                        continue
                if terminated and code is not None and not life.asked_to_stop:
                    log(f"supervise: boot got SIGTERM while the solver was down ({exit_text(code)}): no relaunch")
                    return code
                action = decide(config, now, life, restarts, timeout - (now - begun), start_seen)
                if action.kind == "done":
                    return 0
                if action.kind == "give-up":
                    log(f"supervise: {action.reason}")
                    if code is not None:
                        return code
                    gave_up = True
                elif action.kind == "restart" and code is None:
                    log(f"supervise: {action.reason}: ending the solver (SIGTERM; SIGKILL to its process group after "
                        f"{config.kill_grace_s:.0f} s) to relaunch it with {resume_flag}")
                    process.send_signal(signal.SIGTERM)
                    life, kill_at = replace(life, killed_for=action.reason), now + config.kill_grace_s
                elif action.kind == "restart":
                    restarts += 1
                    current = relaunch_command(command, resume_flag, now - begun, deadline_flag)
                    log(f"supervise: {action.reason}: relaunch {restarts} of at most {config.max_restarts}, with "
                        f"{resume_flag}")
                    break
                time.sleep(POLL_S)
    finally:
        if process is not None and process.poll() is None:  # a timeout, or an error here (an `until` that raised)
            _kill_group(process.pid, signal.SIGKILL)
            process.wait()
            _sweep(process.pid, spare, 5.0, log)
        if handler_set:  # None: a handler not set from Python, i.e. the default
            signal.signal(signal.SIGTERM, signal.SIG_DFL if previous_handler is None else previous_handler)
