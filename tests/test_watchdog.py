"""The watchdog (submission.cli.watchdog) ends a stuck run and every process the run started: an engine's core and
workers (or sandboxes) left behind would keep their memory and hold the caller's pipes open. Seen in CI: a solver
ended by its watchdog left its vLLM engine core running for 40 minutes, and the test reading its output waited
until its own timeout."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

STUCK = """
import subprocess, time
from submission.cli import watchdog
with watchdog(time_limit_s=5.0, hard_stop_s=2.0):  # exits at 3.5 s
    subprocess.Popen(["sh", "-c", "sleep 120 & sleep 120"])  # a child with a child of its own, like an engine core
    print("started", flush=True)
    time.sleep(120)  # stuck
"""


def in_session(sid: int) -> list[int]:
    """Live processes of session `sid` (zombies are not: they hold nothing)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
                found.append(int(entry))
    return found


def test_the_watchdog_ends_the_processes_the_run_started():
    proc = subprocess.Popen([sys.executable, "-c", STUCK], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)  # returns once every holder of the pipes is gone
        assert proc.returncode == 0 and "started" in out and "watchdog: deadline reached" in err
        time.sleep(0.5)
        assert in_session(proc.pid) == []
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
