"""Boot's own virtual environment, with every distribution of the lock at its locked version (issue 27, section 3).

    from submission.kaggle.locked_install import prepare
    python = prepare(sys.executable, Path("/tmp/arc-env"), bundle / "wheels", lock_text, timeout=3600)

Installing the top-level requirements (`pip install -r requirements/runtime-gpu.txt`) into Kaggle's Python pins a dozen
packages; the ~190 transitive ones keep whatever the image has when it satisfies their ranges (an image with
`packaging 24.0` kept it instead of the locked 26.4). So boot installs into an environment the image cannot leak into
(a `python -m venv` without system site packages, run with `isolated_env`: no PYTHONPATH, no PIP_* variable or pip
configuration), installs the WHOLE lock there with `--no-deps --require-hashes` (the lock carries every wheel's
sha256), and then checks with importlib.metadata, in that interpreter, that each locked distribution has its locked
version (`verify`: one line per mismatch). Standard library only: this runs under the image's bare Python before any
wheel is installed.

An environment installed once is reused: a stamp file holds the lock's sha256 after a verified install (`ready`), and
a reused environment is verified again (a tampered one is rebuilt). A venv copied to another path (`shutil.copytree`
with `symlinks=True`) still runs `bin/python` correctly, because the interpreter finds pyvenv.cfg next to the unresolved
`bin/python`; what a copy breaks is the absolute paths pip writes: the `#!` lines of console scripts in `bin/` and the
activate scripts, which still name the source. `copy_environment` copies (optionally with hard links, for the test
matrix) and rewrites those. Callers that run `python -m ...` with the returned interpreter do not need the rewrite.

Where the image's Python has no ensurepip (Debian and Ubuntu builds without python3-venv, the Colab base that Kaggle's
image builds on), the venv is created `--without-pip` and the image's own pip installs into it
(`python -m pip --python VENV/bin/python`, pip 22.3 or newer). The solver must run with `isolated_env(os.environ)`
too: a PYTHONPATH entry comes before site-packages on sys.path, so the image's packages would shadow the locked ones.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

STAMP = "arc-kit-lock.sha256"  # in the venv: the sha256 of the lock it was installed and verified from
LOCK_COPY = "arc-kit-lock.txt"  # in the venv: the lock pip installed (the record of what is there)
TAIL_CHARS = 3000  # how much of pip's output an InstallError carries
# Variables that let the image's packages or pip settings into boot's environment: PYTHONPATH comes before
# site-packages; PIP_USER=1 makes pip refuse a venv; PIP_INDEX_URL, PIP_FIND_LINKS add sources;
# _PIP_RUNNING_IN_SUBPROCESS stops `pip --python` from handing over to the venv's interpreter.
_LEAKY = ("PYTHONPATH", "PYTHONHOME", "PYTHONUSERBASE", "PYTHONSTARTUP", "VIRTUAL_ENV", "__PYVENV_LAUNCHER__")
_LINE = re.compile(r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)==(?P<version>[^\s;#]+)(?:\s|$)")
_VERSIONS = """import importlib.metadata as m, json
print(json.dumps([[d.metadata["Name"], d.version] for d in m.distributions() if d.metadata["Name"]]))
"""


class InstallError(RuntimeError):
    """Boot's environment could not be made or does not hold the lock; the message says what to do."""


# ---------------------------------------------------------------------------------------------------- pure policy


def canonical(name: str) -> str:
    """PEP 503's normalised name: runs of `-`, `_`, `.` become one `-`, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _entries(lock_text: str) -> list[tuple[int, str]]:
    return [(number, line.strip()) for number, line in enumerate(lock_text.splitlines(), 1)
            if line.strip() and not line.strip().startswith("#")]


def locked_versions(lock_text: str) -> dict[str, str]:
    """Canonical name -> version of every `name==version --hash=...  # file` line; ValueError on any other line or a
    name locked twice (the lock is the whole truth, so nothing in it may be skipped)."""
    out: dict[str, str] = {}
    for number, line in _entries(lock_text):
        match = _LINE.match(line)
        if not match:
            raise ValueError(f"lock line {number}: {line[:120]!r} is not name==version")
        name = canonical(match["name"])
        if name in out:
            raise ValueError(f"lock line {number}: {name} is locked twice")
        out[name] = match["version"]
    return out


def locked_files(lock_text: str) -> list[str]:
    """The wheel file each lock line names in its `# file` comment (offline_wheels.lock writes one on every line)."""
    return [line.rsplit("#", 1)[1].strip() for _, line in _entries(lock_text) if "#" in line]


def mismatches(locked: Mapping[str, str], installed: Mapping[str, str]) -> list[str]:
    """One line per locked distribution that is missing or has another version, by name; both maps by canonical name.
    Distributions that are installed but not locked (pip itself) are not reported."""
    lines = []
    for name, version in sorted(locked.items()):
        have = installed.get(name)
        if have is None:
            lines.append(f"{name}: not installed, {version} locked")
        elif have != version:
            lines.append(f"{name}: {have} installed, {version} locked")
    return lines


def lock_digest(lock_text: str) -> str:
    return hashlib.sha256(lock_text.encode()).hexdigest()


def isolated_env(environ: Mapping[str, str]) -> dict[str, str]:
    """`environ` without what lets the image into boot's environment (PYTHONPATH and the like, every PIP_* variable);
    pip reads no configuration file. Run pip, the checks and the solver with it."""
    env = {k: v for k, v in environ.items() if k not in _LEAKY and not k.startswith(("PIP_", "_PIP_"))}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


def environment_python(venv: Path) -> Path:
    """The interpreter of the venv at `venv` (Linux layout: Kaggle's)."""
    return venv / "bin" / "python"


# ---------------------------------------------------------------------------------------------------- I/O


def _run(command: Sequence[str | Path], timeout: float, env: Mapping[str, str] | None, what: str,
         cwd: Path | None = None) -> subprocess.CompletedProcess:
    try:
        return subprocess.run([str(part) for part in command], capture_output=True, text=True, cwd=cwd,
                              timeout=max(1.0, timeout), env=dict(isolated_env(os.environ) if env is None else env))
    except subprocess.TimeoutExpired:
        raise InstallError(f"{what} took over {max(1.0, timeout):.0f} s") from None


def _tail(result: subprocess.CompletedProcess) -> str:
    return ((result.stdout or "") + (result.stderr or "")).strip()[-TAIL_CHARS:]


def create_environment(python: str, venv: Path, *, timeout: float = 600.0,
                       env: Mapping[str, str] | None = None) -> Path:
    """A new virtual environment at `venv` (its contents deleted first), without the image's site packages; its python.

    With pip (ensurepip) where the image's Python can; where it cannot (no ensurepip), without pip, and then
    `pip_command` installs with the image's pip. InstallError when neither works, with both outputs."""
    venv = venv.absolute()
    with_pip = _run([python, "-m", "venv", "--clear", venv], timeout, env, f"creating {venv} with {python}")
    if with_pip.returncode == 0:
        return environment_python(venv)
    without = _run([python, "-m", "venv", "--clear", "--without-pip", venv], timeout, env,
                   f"creating {venv} with {python}")
    if without.returncode == 0:
        return environment_python(venv)
    raise InstallError(f"{python} cannot create a virtual environment at {venv} (with pip: ensurepip failed or is "
                       f"missing; without pip as well):\n{_tail(with_pip)}\n---\n{_tail(without)}")


def has_pip(python: Path, *, env: Mapping[str, str] | None = None) -> bool:
    probe = _run([python, "-c", "import importlib.util, sys; sys.exit(importlib.util.find_spec('pip') is None)"],
                 60, env, f"looking for pip in {python}")
    return probe.returncode == 0


def pip_command(python: str, venv_python: Path, *, env: Mapping[str, str] | None = None) -> list[str]:
    """How to run pip for the venv: its own pip, or (a venv made without pip) the image's pip handed the venv's
    interpreter with `--python` (pip runs itself under that interpreter, so it installs into the venv only)."""
    if has_pip(venv_python, env=env):
        return [str(venv_python), "-m", "pip"]
    return [python, "-m", "pip", "--python", str(venv_python)]


def require_wheels(lock_text: str, wheels: Path) -> None:
    """InstallError naming every wheel file the lock lists that `wheels` lacks (a clearer message than pip's, and
    before anything is spent)."""
    present = {p.name for p in Path(wheels).iterdir()} if Path(wheels).is_dir() else set()
    missing = [f for f in locked_files(lock_text) if f not in present]
    if missing:
        raise InstallError(f"{len(missing)} locked wheel(s) missing from {wheels}: {', '.join(missing)}")


def install_lock(venv_python: Path, wheels: Path, lock: Path, timeout: float, *, pip: Sequence[str] | None = None,
                 env: Mapping[str, str] | None = None) -> None:
    """Install every line of `lock` from `wheels` alone: `--no-index --no-deps --require-hashes --only-binary`, so
    pip neither resolves nor looks anywhere else, and each wheel's sha256 must match the lock. A wheel the lock names
    but the folder lacks is reported by name before pip starts; any other failure (and a timeout) raises InstallError
    with pip's last lines. For a new environment: pip skips a requirement that is already installed at its version
    without checking any hash ("already satisfied"), so a wheel it did not install was never checked."""
    require_wheels(Path(lock).read_text(), wheels)
    command = [*(pip or [str(venv_python), "-m", "pip"]), "install", "--no-index", "--find-links", str(wheels),
               "--no-deps", "--require-hashes", "--only-binary=:all:", "--no-warn-script-location",
               "--disable-pip-version-check", "--quiet", "-r", str(lock)]
    result = _run(command, timeout, env, f"installing the lock from {wheels}")
    if result.returncode != 0:
        hint = " or an image pip older than 22.3, which has no --python" if "--python" in command else ""
        raise InstallError(f"installing the lock from {wheels} failed (a wheel missing, corrupt, or for another "
                           f"Python{hint}?):\n{_tail(result)}")


def installed_versions(venv_python: Path, *, env: Mapping[str, str] | None = None,
                       timeout: float = 120.0) -> dict[str, str]:
    """Canonical name -> version of what `venv_python` imports, read by importlib.metadata in that interpreter.
    Where a name is installed twice on its sys.path, the first one (the one `import` finds) counts."""
    result = _run([venv_python, "-c", _VERSIONS], timeout, env, f"listing the distributions of {venv_python}",
                  cwd=Path(venv_python).parent)
    if result.returncode != 0:
        raise InstallError(f"{venv_python} could not list its distributions:\n{_tail(result)}")
    out: dict[str, str] = {}
    for name, version in json.loads(result.stdout.strip().splitlines()[-1]):
        out.setdefault(canonical(name), version)
    return out


def verify(venv_python: Path, lock_text: str, *, env: Mapping[str, str] | None = None) -> list[str]:
    """One line per locked distribution that `venv_python` lacks or has at another version; empty when it holds the
    lock. Run with the environment the solver will get (default `isolated_env(os.environ)`)."""
    return mismatches(locked_versions(lock_text), installed_versions(venv_python, env=env))


def ready(venv: Path, lock_text: str) -> bool:
    """True when `venv` was installed and verified from exactly this lock and its python is still there."""
    stamp = venv / STAMP
    return (environment_python(venv).exists() and stamp.is_file()
            and stamp.read_text().strip() == lock_digest(lock_text))


def copy_environment(source: Path, dest: Path, *, hardlink: bool = False) -> Path:
    """A working copy of the venv `source` at `dest` (which must not exist); its python.

    `bin/python` works in any copy; the rewrite is for the absolute paths pip wrote, the `#!` lines of console
    scripts and the activate scripts, which would otherwise run the source's interpreter. With `hardlink`, files are
    hard links (no disk, near-instant: pip replaces files rather than writing into them, so a change to one copy stays
    there) and the rewritten scripts are new files, so the source keeps its own."""
    source, dest = source.absolute(), dest.absolute()
    shutil.copytree(source, dest, symlinks=True, copy_function=os.link if hardlink else shutil.copy2)
    old = re.compile(re.escape(os.fsencode(source)) + rb"(?=[/'\"\s]|$)", re.MULTILINE)
    for path in (dest / "bin").iterdir():
        if path.is_symlink() or not path.is_file():
            continue
        data = path.read_bytes()
        if not (data.startswith(b"#!") or path.name.startswith("activate")):
            continue  # a compiled executable: no text to rewrite
        new = old.sub(os.fsencode(dest), data)
        if new != data:
            temporary = path.with_name(path.name + ".rewrite")
            temporary.write_bytes(new)
            shutil.copymode(path, temporary)
            os.replace(temporary, path)  # a new file: a hard-linked source keeps its own
    return environment_python(dest)


def prepare(python: str, venv: Path, wheels: Path, lock_text: str, timeout: float,
            log: Callable[[str], object] = print) -> Path:
    """Boot's environment at `venv` holding exactly the lock; its python. Reused when `ready` and still verified,
    otherwise (re)created, installed from `wheels` and verified; InstallError with every mismatch line if the install
    does not hold the lock. `timeout` bounds the whole of it. One short line per step goes to `log`."""
    deadline = time.monotonic() + timeout
    venv = venv.absolute()
    env = isolated_env(os.environ)
    count = len(locked_versions(lock_text))  # a malformed lock fails here, before anything is spent
    interpreter = environment_python(venv)
    if ready(venv, lock_text):
        problems = verify(interpreter, lock_text, env=env)
        if not problems:
            log(f"environment: reusing {venv} (installed from this lock; {count} distributions verified)")
            return interpreter
        log(f"environment: {venv} was installed from this lock but {len(problems)} distribution(s) changed since "
            f"({problems[0]}{', ...' if len(problems) > 1 else ''}): recreating it")
    require_wheels(lock_text, wheels)
    log(f"environment: creating {venv} with {python} (no system site packages)")
    interpreter = create_environment(python, venv, timeout=deadline - time.monotonic(), env=env)
    pip = pip_command(python, interpreter, env=env)
    if "--python" in pip:
        log(f"environment: {python} has no ensurepip, so the venv has no pip: installing with the image's pip "
            f"(pip --python {interpreter})")
    (venv / LOCK_COPY).write_text(lock_text)
    log(f"environment: installing the {count} locked wheels from {wheels} (--no-deps, hashes checked)")
    started = time.monotonic()
    install_lock(interpreter, wheels, venv / LOCK_COPY, deadline - time.monotonic(), pip=pip, env=env)
    problems = verify(interpreter, lock_text, env=env)
    if problems:
        raise InstallError(f"after installing from {wheels}, {len(problems)} locked distribution(s) in {venv} are not "
                           "at their locked version:\n" + "\n".join(problems))
    (venv / STAMP).write_text(lock_digest(lock_text) + "\n")
    log(f"environment: installed in {time.monotonic() - started:.0f} s; all {count} locked distributions verified")
    return interpreter
