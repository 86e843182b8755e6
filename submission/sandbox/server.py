"""The warm sandbox server: one forked child per program check. Started by `submission.sandbox.client.Sandbox`, never
by hand.

Why a server: a fresh interpreter that imports numpy costs ~290 ms per check; forking a warm process that has already
imported numpy costs a few ms (benchmarks/RESULTS.md). The server takes the checks' limits as JSON in argv[1], reads one
JSON request per line on stdin ({"program", "inputs"}) and answers one JSON line on stdout; children report one
size-capped JSON line per grid over a pipe (never pickle: the parent must not execute anything a child sends). Grids
travel as digit rows joined by "/" (`submission.grids.to_cells`), which the caller checks before trusting.

Layers, strongest last; each is reported in the hello line so callers know what is active:
- own session + process group, killed with SIGKILL and reaped after every check (always);
- rlimits: CPU seconds (SIGXCPU, then SIGKILL one second later), address space, file size 0, no core files, few fds;
  PR_SET_PDEATHSIG so a child dies with the server (always; the server itself is single-threaded);
- output: stdout/stderr go to /dev/null, results through a pipe read with a byte cap and a wall-clock deadline (always);
  the wall clock does not count time the child spent waiting for a CPU (/proc/PID/schedstat), so a busy machine does
  not kill honest programs; `backstop_s` bounds the whole check however starved it is;
- working folder: a private temporary folder, deleted as soon as the server has entered it, so children start in a
  folder where nothing can be created and no folder survives the server, however it ends (always);
- subreaper: orphaned grandchildren are re-parented to the server and swept after each check (when prctl allows);
- network namespace with no interfaces up, created once for the server (when the kernel lets us unshare);
- seccomp deny-list (libseccomp via pyseccomp, compiled once, loaded per child as raw BPF): opening files for writing,
  creating, deleting, renaming, linking, chmod/chown, sockets, fork/clone/exec, kill, raising rlimits, setsid,
  ptrace, namespaces and mounts fail with EPERM.
What it does not protect against: deliberate malice by code running as the same user when seccomp is unavailable
(it can then delete the user's files, kill the user's processes or raise its own limits as root), kernel exploits, and
side channels. It is built against accidents: loops, memory blow-ups, print bombs, crashes and stray children.
"""

from __future__ import annotations

import ctypes
import errno
import gc
import json
import os
import resource
import select
import signal
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path

# Run as a script under `python -I`: make the kit importable without trusting PYTHONPATH or the working directory.
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from submission.grids import from_cells, to_cells, to_grid  # noqa: E402

# Modules a transform may use, imported before any fork so children start warm (and need no file access for them).
WARM_MODULES = ("numpy", "numpy.linalg", "collections", "itertools", "functools", "math", "copy", "heapq", "re",
                "typing", "dataclasses", "operator", "statistics", "fractions", "string", "bisect", "random", "enum",
                "array", "queue")

MESSAGE_CHARS = 400  # error messages are cut to this length: a program controls its exception text
_libc = ctypes.CDLL(None, use_errno=True)
_PR_SET_PDEATHSIG, _PR_SET_CHILD_SUBREAPER, _PR_SET_NO_NEW_PRIVS, _PR_SET_SECCOMP = 1, 36, 38, 22
_SECCOMP_MODE_FILTER = 2
_CLONE_NEWNET = 0x40000000

_DENIED_SYSCALLS = (
    "creat", "openat2", "unlink", "unlinkat", "rename", "renameat", "renameat2", "rmdir", "mkdir", "mkdirat",
    "link", "linkat", "symlink", "symlinkat", "chmod", "fchmod", "fchmodat", "chown", "fchown", "lchown", "fchownat",
    "truncate", "ftruncate", "mknod", "mknodat", "utime", "utimes", "utimensat", "futimesat",
    "socket", "socketpair", "fork", "vfork", "clone", "clone3", "execve", "execveat",
    "kill", "tkill", "tgkill", "rt_sigqueueinfo", "rt_tgsigqueueinfo", "pidfd_send_signal", "pidfd_open",
    "setrlimit", "setsid", "setpgid", "ptrace", "process_vm_writev", "unshare", "setns", "mount", "umount2",
    "chroot", "pivot_root", "setuid", "setgid", "setreuid", "setregid", "setresuid", "setresgid", "setgroups",
    "bpf", "io_uring_setup", "memfd_create", "keyctl", "add_key", "request_key", "personality", "reboot",
)


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def _compile_seccomp() -> tuple[ctypes.Array, _SockFprog] | str:
    """The deny-list as raw BPF, ready for prctl in a child; or the reason it is unavailable."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError) as err:  # OSError: libseccomp.so.2 missing
        return f"pyseccomp unavailable: {err}"
    try:
        f = sc.SyscallFilter(sc.ALLOW)
        deny = sc.ERRNO(errno.EPERM)
        for name in _DENIED_SYSCALLS:
            try:
                f.add_rule(deny, name)
            except (OSError, ValueError):
                pass  # not a syscall on this architecture (aarch64 has no open, fork, rename, ...)
        writes = (os.O_WRONLY, os.O_RDWR, os.O_CREAT, os.O_TRUNC, os.O_APPEND)
        for name, flags_arg in (("open", 1), ("openat", 2)):
            for flag in writes:
                try:
                    f.add_rule(deny, name, sc.Arg(flags_arg, sc.MASKED_EQ, flag, flag))
                except (OSError, ValueError):
                    pass
        # prlimit64 with a NULL new-limit pointer only reads limits (resource.getrlimit uses it): allow that.
        f.add_rule(deny, "prlimit64", sc.Arg(2, sc.NE, 0))
        with tempfile.TemporaryFile() as tmp:
            f.export_bpf(tmp)
            tmp.seek(0)
            code = tmp.read()
    except OSError as err:
        return f"seccomp filter could not be built: {err}"
    buf = ctypes.create_string_buffer(code, len(code))
    return buf, _SockFprog(len(code) // 8, ctypes.addressof(buf))


def _prctl(option: int, arg: int) -> bool:
    return _libc.prctl(option, ctypes.c_ulong(arg), 0, 0, 0) == 0


def _setup_server() -> tuple[dict, object]:
    """Create the per-server layers; return (layer report, compiled seccomp filter or None).

    No PR_SET_PDEATHSIG on the server: it fires when the client *thread* that started the server exits (a worker
    thread of a pool), not the client process. The server ends instead when its stdin closes or its parent changes
    (`_next_request`)."""
    layers: dict[str, object] = {"session_rlimits": True}
    layers["subreaper"] = _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    if _libc.unshare(_CLONE_NEWNET) == 0:
        layers["netns"] = True
    else:
        layers["netns"] = f"unshare(CLONE_NEWNET) failed: {os.strerror(ctypes.get_errno())}"
    compiled = _compile_seccomp() if os.environ.get("ARC_SANDBOX_SECCOMP") != "0" else "disabled by the caller"
    layers["seccomp"] = True if not isinstance(compiled, str) else compiled
    return layers, (None if isinstance(compiled, str) else compiled)


def _child(request_fd: int, wfd: int, seccomp, limits: dict) -> None:
    """Runs in the forked child: isolate (limits and seccomp too, so that none of it is paid once the request has
    come), wait for the request, run `transform` on every input, report, exit."""
    os.setsid()
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):
        os.dup2(devnull, fd)
    keep = sorted((request_fd, wfd))
    os.closerange(3, keep[0])
    os.closerange(keep[0] + 1, keep[1])
    os.closerange(keep[1] + 1, 4096)
    cpu = int(limits["cpu_s"])
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (limits["memory_bytes"], limits["memory_bytes"]))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the size limit fails with EFBIG, not a signal
    if seccomp is not None:
        _prctl(_PR_SET_NO_NEW_PRIVS, 1)
        if _libc.prctl(_PR_SET_SECCOMP, _SECCOMP_MODE_FILTER, ctypes.byref(seccomp[1]), 0, 0) != 0:
            os._exit(70)  # never run a program with fewer layers than the server reported
    with os.fdopen(request_fd, "rb") as f:
        request = json.loads(f.read() or b"null")
    if request is None:
        os._exit(0)  # the server closed without a request (shutdown)
    inputs = [[list(row) for row in from_cells(text)] for text in request["inputs"]]  # lists, as JSON would give
    out = os.fdopen(wfd, "w")

    def report(i: int, status: str, output=None, err: BaseException | None = None) -> None:
        line = {"i": i, "status": status, "output": output}
        if err is not None:
            line["error_type"] = type(err).__name__
            try:
                line["message"] = str(err)[:MESSAGE_CHARS]
            except BaseException:  # noqa: BLE001 - a hostile __str__
                line["message"] = "<unprintable>"
        out.write(json.dumps(line) + "\n")
        out.flush()

    def finish() -> None:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        out.write(json.dumps({"done": True, "cpu_s": usage.ru_utime + usage.ru_stime}) + "\n")
        out.flush()
        os._exit(0)

    namespace: dict = {"__name__": "arc_program", "__builtins__": __builtins__}
    try:
        exec(compile(request["program"], "<program>", "exec"), namespace)  # noqa: S102 - this is the sandbox
        transform = namespace["transform"]
        if not callable(transform):
            raise TypeError("transform is not callable")
    except BaseException as err:  # noqa: BLE001 - SystemExit and KeyError (no transform) alike
        for i in range(len(inputs)):
            report(i, "error", err=err)
        finish()
    for i, grid in enumerate(inputs):
        try:
            result = transform(grid)
        except BaseException as err:  # noqa: BLE001
            report(i, "error", err=err)
            continue
        try:
            report(i, "ok", to_cells(to_grid(result)))
        except BaseException as err:  # noqa: BLE001 - GridError, or a hostile __len__ or __iter__
            report(i, "invalid", err=err)
    finish()


class Spare:
    """A child forked ahead of time, isolated and waiting for its request: the fork's cost is paid between checks."""

    def __init__(self, seccomp, limits: dict):
        request_r, self.request_w = os.pipe()
        self.result_r, result_w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:
            try:
                os.close(self.request_w)
                os.close(self.result_r)
                _child(request_r, result_w, seccomp, limits)
            finally:
                os._exit(71)
        os.close(request_r)
        os.close(result_w)

    def discard(self) -> None:
        """Kill and reap a child that will not be used (or whose check failed in the server)."""
        for fd in (self.request_w, self.result_r):
            try:
                os.close(fd)
            except OSError:
                pass  # already closed
        try:
            os.killpg(self.pid, signal.SIGKILL)
            os.waitpid(self.pid, 0)
        except (OSError, ChildProcessError):
            pass


def _sweep_orphans(keep: int) -> int:
    """Kill and reap every process re-parented to this server (the subreaper), children that escaped their group,
    except `keep` (the waiting spare)."""
    me, killed = os.getpid(), 0
    for _ in range(50):  # a fork bomb may refill while we sweep; bounded
        found = False
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == me and int(entry) != keep:
                found = True
                try:
                    os.kill(int(entry), signal.SIGKILL)
                    killed += 1
                except OSError:
                    pass
        while True:  # reap what was killed (never the spare: it is alive, so WNOHANG skips it)
            try:
                pid, _ = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
        if not found:
            break
        time.sleep(0.001)
    return killed


def _runnable(pid: int) -> bool:
    """Whether `pid` is running or waiting for a CPU (state R), rather than sleeping or blocked."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "R"
    except (OSError, IndexError):
        return False


def _waited_s(pid: int) -> float | None:
    """Seconds `pid` has spent runnable but waiting for a CPU (the kernel's run-queue time), or None if unknown."""
    try:
        return int(Path(f"/proc/{pid}/schedstat").read_text().split()[1]) / 1e9
    except (OSError, ValueError, IndexError):
        return None


@dataclass(frozen=True)
class Ending:
    """How a check's collection ended, for the inputs the child gave no line for."""

    done: bool = False  # the child reported everything it would
    timed_out: str = ""  # "wall": wall_s ran out (time waiting for a CPU not counted); "backstop": backstop_s did
    overflow: bool = False  # the result bytes went over the cap
    waited_s: float = 0.0  # time the child spent waiting for a CPU (not counted against wall_s)


def _classify_missing(ending: Ending, status: int, cpu: float, limits: dict) -> dict:
    """What to report for inputs the child gave no line for, from how the check ended. Pure."""
    if ending.done:
        return {"status": "crash", "message": "no result for this input"}
    if ending.timed_out == "backstop":
        return {"status": "timeout", "message": f"wall-clock backstop {limits['backstop_s']} s (starved of CPU: "
                                                f"{ending.waited_s:.1f} s waiting for one)"}
    if ending.timed_out:
        starved = f" (+{ending.waited_s:.1f} s waiting for a CPU, not counted)" if ending.waited_s >= 0.1 else ""
        return {"status": "timeout", "message": f"wall-clock limit {limits['wall_s']} s{starved}"}
    if ending.overflow:
        return {"status": "crash", "message": f"result exceeded {limits['max_result_bytes']} bytes"}
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu >= int(limits["cpu_s"])):
            return {"status": "timeout", "message": f"CPU limit {int(limits['cpu_s'])} s"}
        return {"status": "crash", "message": f"killed by {signal.Signals(sig).name}"}
    return {"status": "crash", "message": f"exited with code {os.WEXITSTATUS(status)} before finishing"}


def collect(request: dict, limits: dict, child: Spare, start: float) -> tuple[bytes, object]:
    """Collect the child's lines under the byte cap and the deadline (from `start`), then kill its group.

    The deadline is `wall_s` of wall clock not spent waiting for a CPU (a sleeping or blocked program is stopped at
    `wall_s`; a starved one is not, its CPU time is bounded by RLIMIT_CPU), and never later than `backstop_s`. The
    wait is the kernel's run-queue total, plus "runnable right now" at the deadline (the total lags by the current
    wait): approximate, measured on the child's main thread.
    Returns the reply and a function that reaps the child (called after the reply is sent when the child reported
    everything, so its exit does not delay the caller)."""
    n = len(request["inputs"])
    wall_s = limits["wall_s"]
    backstop_s = max(limits.get("backstop_s", wall_s), wall_s)
    lines: dict[int, bytes] = {}  # forwarded to the caller as they came: parsed here only for their index
    buf, total, done, timed_out, overflow, cpu, waited = b"", 0, False, "", False, 0.0, 0.0
    while not done:
        elapsed = time.monotonic() - start
        remaining = wall_s + waited - elapsed
        if remaining <= 0:
            waited = max(waited, _waited_s(child.pid) or 0.0)  # it was starved, not slow: give that time back
            remaining = wall_s + waited - elapsed
            if remaining <= 0 and _runnable(child.pid):
                remaining = 0.05  # waiting for a CPU right now: the kernel adds that to its total only later
        timeout = min(remaining, backstop_s - elapsed)
        # with no time left this only polls: results already in the pipe win over a late deadline (a starved server)
        if not select.select([child.result_r], [], [], max(timeout, 0.0))[0]:
            if timeout <= 0:
                timed_out = "backstop" if elapsed >= backstop_s else "wall"
                break
            continue
        chunk = os.read(child.result_r, 65536)
        if not chunk:
            break
        total += len(chunk)
        if total > limits["max_result_bytes"]:
            overflow = True
            break
        buf += chunk
        *complete, buf = buf.split(b"\n")
        for line in complete:
            msg = json.loads(line)
            if msg.get("done"):
                done, cpu = True, float(msg.get("cpu_s", 0.0))
            elif isinstance(msg.get("i"), int) and 0 <= msg["i"] < n:
                lines[msg["i"]] = line
    os.close(child.result_r)
    wall = time.monotonic() - start
    try:
        os.killpg(child.pid, signal.SIGKILL)
    except OSError:
        pass

    def reap() -> tuple[int, float]:
        _, status, usage = os.wait4(child.pid, 0)
        return status, usage.ru_utime + usage.ru_stime

    if done and len(lines) == n:
        return _reply([lines[i] for i in range(n)], wall, cpu), reap
    status, cpu = reap()
    missing = _classify_missing(Ending(done, timed_out, overflow, waited), status, cpu, limits)
    filler = json.dumps(dict(missing, output=None)).encode()
    return _reply([lines.get(i, filler) for i in range(n)], wall, cpu), lambda: None


def _reply(outputs: list[bytes], wall: float, cpu: float) -> bytes:
    return b'{"outputs": [' + b", ".join(outputs) + f'], "wall_s": {wall}, "cpu_s": {cpu}}}'.encode()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _next_request(parent: int) -> bytes | None:
    """The next request line, or None when the client is gone: its end of the pipe closed, or the server was
    re-parented (the client process died while something else still holds the pipe, e.g. a process it forked)."""
    stdin = sys.stdin.buffer
    while os.getppid() == parent:
        if select.select([stdin], [], [], 1.0)[0]:
            return stdin.readline() or None
    return None


def _enter_private_folder() -> None:
    """Work in a fresh folder that no longer exists: children inherit it as their working folder, where nothing can
    be created, and no folder is left behind however the server ends (SIGKILL, OOM killer)."""
    scratch = tempfile.mkdtemp(prefix="arc-sandbox-")
    os.chdir(scratch)
    os.rmdir(scratch)


def main() -> None:
    """argv[1]: the checks' limits as JSON (`submission.sandbox.client.SandboxLimits`), fixed for the server's life so
    that every spare child is forked with them already applied."""
    limits = json.loads(sys.argv[1])
    parent = os.getppid()
    for name in WARM_MODULES:
        __import__(name)
    layers, seccomp = _setup_server()
    _enter_private_folder()
    gc.freeze()  # the collector in a child would touch every inherited object and copy all their pages
    stdout = sys.stdout.buffer
    stdout.write(json.dumps({"ready": True, "pid": os.getpid(), "layers": layers}).encode() + b"\n")
    stdout.flush()
    sweep = seccomp is None  # with seccomp no child can fork, so there is nothing to sweep
    spare = Spare(seccomp, limits)
    try:
        while (raw := _next_request(parent)) is not None:
            child, spare = spare, None
            try:
                request = json.loads(raw)
                start = time.monotonic()
                try:
                    _write_all(child.request_w, raw)
                except BrokenPipeError:  # the spare died while waiting (killed from outside): use a fresh one
                    child.discard()
                    child = Spare(seccomp, limits)
                    _write_all(child.request_w, raw)
                os.close(child.request_w)
                spare = Spare(seccomp, limits)  # forked while `child` runs (the machine has >= 2 cores)
                reply, reap = collect(request, limits, child, start)
            except Exception:  # noqa: BLE001 - report server bugs to the client instead of dying silently
                reply, reap = json.dumps({"server_error": traceback.format_exc(limit=5)}).encode(), child.discard
            if sweep:  # before the reply: when a check returns, nothing it started is still alive
                reap()
                _sweep_orphans(keep=spare.pid if spare else -1)
            stdout.write(reply + b"\n")
            stdout.flush()
            if not sweep:
                reap()  # after the reply: the child's exit does not delay the caller
            spare = spare or Spare(seccomp, limits)
    finally:
        if spare is not None:
            spare.discard()


if __name__ == "__main__":
    main()
