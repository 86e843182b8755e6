"""The hostile battery (tests/hostile/*.py): none may hang the caller, crash it, leave a process behind or change a file.

Each program's header says which statuses are acceptable (`# expect:`) and, for deliberate malice that only seccomp or
the network namespace can stop, which layer it needs (`# layers:`). The battery runs twice: with every layer, and with
seccomp off (the fallback on machines without libseccomp), where the accident cases must still be contained.
"""

from __future__ import annotations

import os
import socket
import string
import time
from pathlib import Path

import pytest

from submission.sandbox.client import SERVER, Sandbox, SandboxLimits, Status
from submission.tasks import load_tasks

HOSTILE = sorted((Path(__file__).parent / "hostile").glob("*.py"))
# The battery asserts a hard bound on every check's wall time, so its backstop is its wall clock: time waiting for a
# CPU is not given back here (that, and the default 60 s backstop, are tested in tests/faults/test_sandbox_faults.py).
LIMITS = SandboxLimits(cpu_s=2, memory_mb=1024, wall_s=3.0, backstop_s=3.0)
MARKERS = ("98765",)  # the hostile shell commands carry this number in their command lines


def header(path: Path, key: str) -> set[str]:
    for line in path.read_text().splitlines():
        if line.startswith(f"# {key}:"):
            return set(line.split(":", 1)[1].split())
    return set()


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (ppid, command line) for every process on the machine."""
    out = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            out[int(entry)] = (ppid, cmd)
    return out


def leftovers(server_pid: int | None) -> list[str]:
    """Processes a check left behind: forked copies of the server beyond its one waiting spare child, or the hostile
    shell commands."""
    found, spares = [], []
    for pid, (ppid, cmd) in processes().items():
        if str(SERVER) in cmd and pid != server_pid and ppid != os.getpid():
            (spares if ppid == server_pid else found).append(f"{pid} (parent {ppid}): {cmd}")
        elif any(m in cmd for m in MARKERS) and "pytest" not in cmd:
            found.append(f"{pid} (parent {ppid}): {cmd}")
    return found + (spares if len(spares) != 1 else [])


@pytest.fixture(scope="module")
def task(arc_data):
    return load_tasks(arc_data / "arc-agi-2" / "training" / "3c9b0459.json").tasks[0]


@pytest.fixture(scope="module", params=["all layers", "no seccomp"])
def box(request):
    with Sandbox(LIMITS, seccomp=request.param == "all layers") as sandbox:
        yield sandbox


@pytest.mark.parametrize("program", HOSTILE, ids=[p.stem for p in HOSTILE])
def test_hostile_program_is_contained(program, box, task, tmp_path):
    needs = header(program, "layers")
    if needs and not any(box.layers.get(layer) is True for layer in needs):
        pytest.skip(f"needs one of {sorted(needs)}; active: {box.layers}")
    target = tmp_path / "precious.txt"
    target.write_text("precious")
    os.chmod(target, 0o666)
    os.chmod(tmp_path, 0o777)  # so that only the sandbox, not file permissions, can protect it
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    listener.setblocking(False)
    source = string.Template(program.read_text()).safe_substitute(target=target, port=listener.getsockname()[1])

    started = time.monotonic()
    result = box.check(source, task)
    elapsed = time.monotonic() - started

    statuses = {p.status.value for p in result.train + result.test}
    assert statuses <= header(program, "expect"), [(p.status, p.error_type, p.message) for p in result.train]
    assert elapsed < LIMITS.wall_s + 5, f"check took {elapsed:.1f} s"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["precious.txt"] and target.read_text() == "precious"
    with pytest.raises(BlockingIOError):
        listener.accept()  # nothing connected
    listener.close()
    time.sleep(0.05)
    server = box._proc.pid if box._proc else None
    assert not leftovers(server), leftovers(server)
    # the caller and the sandbox are still usable: a correct program passes right after
    after = box.check("def transform(grid):\n    return [row[::-1] for row in grid[::-1]]\n", task)
    assert after.train_perfect and after.test[0].status is Status.RIGHT


def test_layers_are_reported(task):
    with Sandbox(LIMITS, seccomp=False) as box:
        assert box.layers["session_rlimits"] is True
        assert box.layers["seccomp"] == "disabled by the caller"
