"""Boot's locked install (submission/kaggle/locked_install.py, issue 27 section 3): the real locks parse line for line,
and on wheels built here (stdlib zipfile, no network, no torch) the whole lock lands in a venv of boot's own at exactly
the locked versions, also when the "image" Python is seeded with conflicting versions of two locked packages and its
PYTHONPATH and PIP_* settings point at them; verify reports one line per changed distribution; a missing or corrupt
wheel fails naming it; a copied venv works; an image without ensurepip still installs."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from submission.kaggle import locked_install
from submission.kaggle.locked_install import (InstallError, copy_environment, install_lock, installed_versions,
                                              isolated_env, locked_files, locked_versions, mismatches, prepare, ready,
                                              verify)

REPO = Path(__file__).resolve().parents[1]
# The lock of the test wheelhouse: alpha (a top-level package with a console script) depends on Beta_Pkg and gamma,
# as a runtime requirement pins torch and leaves its dependencies to the resolver. Beta_Pkg's odd spelling checks the
# PEP 503 names end to end.
LOCKED = {"alpha": ("1.0", ["beta-pkg>=1.0", "gamma>=2"]), "Beta_Pkg": ("2.0", []), "gamma": ("3.0", [])}
# What the "image" has instead: older Beta_Pkg and gamma that still satisfy alpha's ranges, and a package of its own.
IMAGE = {"Beta_Pkg": ("1.0", []), "gamma": ("2.5", []), "imageonly": ("0.1", [])}


def record_hash(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def make_wheel(folder: Path, name: str, version: str, requires: list[str]) -> Path:
    """A pure-Python wheel: one module `NAME/__init__.py` that knows its version, METADATA, WHEEL, RECORD, and for
    alpha a console script `alpha-where` that prints the interpreter's prefix."""
    module, dist = name.lower(), f"{name.replace('-', '_')}-{version}"
    code = f"__version__ = {version!r}\n\ndef where():\n    import sys\n    print(sys.prefix)\n"
    metadata = "".join([f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                        *(f"Requires-Dist: {r}\n" for r in requires)])
    wheel_file = "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n"
    files = {f"{module}/__init__.py": code, f"{dist}.dist-info/METADATA": metadata,
             f"{dist}.dist-info/WHEEL": wheel_file}
    if name == "alpha":
        files[f"{dist}.dist-info/entry_points.txt"] = "[console_scripts]\nalpha-where = alpha:where\n"
    record = "".join(f"{path},{record_hash(text.encode())},{len(text.encode())}\n" for path, text in files.items())
    files[f"{dist}.dist-info/RECORD"] = record + f"{dist}.dist-info/RECORD,,\n"
    folder.mkdir(parents=True, exist_ok=True)
    wheel = folder / f"{dist}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


def lock_text_for(wheels: list[Path]) -> str:
    """The lock in offline_wheels.lock's format: `name==version --hash=sha256:...  # file`."""
    lines = ["# test: the locked wheelhouse"]
    for wheel in sorted(wheels):
        name, version = wheel.name.split("-")[:2]
        digest = hashlib.sha256(wheel.read_bytes()).hexdigest()
        lines.append(f"{name.replace('_', '-').lower()}=={version} --hash=sha256:{digest}  # {wheel.name}")
    return "\n".join(lines) + "\n"


def run(*command, env=None) -> subprocess.CompletedProcess:
    return subprocess.run([str(c) for c in command], capture_output=True, text=True, check=True,
                          env=env or isolated_env(os.environ))


def pip_into(python: Path, *args) -> None:
    """This test's pip installing into another interpreter (pip --python): seeding an image, tampering with a venv."""
    run(sys.executable, "-m", "pip", "--python", python, "install", "--no-index", "--no-deps", "--quiet", *args)


def imports(python: Path, env=None) -> dict[str, str | None]:
    """What `import NAME` gives in that interpreter: the module's __version__, None when it does not import."""
    script = ("import importlib, json\nout = {}\nfor n in ('alpha', 'beta_pkg', 'gamma', 'imageonly'):\n"
              "    try: out[n] = importlib.import_module(n).__version__\n"
              "    except ImportError: out[n] = None\nprint(json.dumps(out))")
    return json.loads(run(python, "-c", script, env=env).stdout)


def system_python(root: Path) -> tuple[Path, Path]:
    """A Python installation of its own at `root`, like the image's (packages in its own site-packages, not a venv's):
    this interpreter's binary copied to root/bin, its standard library and shared library linked under root/lib, an
    empty site-packages. Python finds its prefix from where the binary is, so root is its sys.prefix, and a venv made
    from it with --system-site-packages would see what is installed there. Its python and its site-packages."""
    stdlib = Path(os.__file__).parent
    (root / "bin").mkdir(parents=True)
    binary = Path(sys._base_executable).resolve()
    shutil.copy2(binary, root / "bin" / binary.name)
    (root / "lib" / stdlib.name / "site-packages").mkdir(parents=True)
    for entry in stdlib.parent.iterdir():  # libpython*.so, where the binary finds it relative to itself
        if entry.name != stdlib.name:
            (root / "lib" / entry.name).symlink_to(entry)
    for entry in stdlib.iterdir():
        if entry.name != "site-packages":
            (root / "lib" / stdlib.name / entry.name).symlink_to(entry)
    python = root / "bin" / binary.name
    assert run(python, "-c", "import sys; print(sys.prefix)").stdout.strip() == str(root)
    return python, root / "lib" / stdlib.name / "site-packages"


@pytest.fixture(scope="module")
def house(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("locked")
    wheels = [make_wheel(root / "wheels", name, *spec) for name, spec in LOCKED.items()]
    for name, spec in IMAGE.items():
        make_wheel(root / "image-wheels", name, *spec)
    return {"root": root, "wheels": root / "wheels", "image_wheels": root / "image-wheels",
            "lock": lock_text_for(wheels)}


@pytest.fixture(scope="module")
def debian_python(tmp_path_factory) -> str:
    """This Python as Debian and Ubuntu ship it without python3-venv (the Colab base of Kaggle's image): `-m venv`
    fails at ensurepip unless --without-pip is given. Also the quick way to a new environment (no ensurepip run)."""
    fake = tmp_path_factory.mktemp("debian") / "python3"
    fake.write_text(f"""#!/bin/sh
case " $* " in *" -m venv "*) case " $* " in *" --without-pip "*) ;; *)
  echo "The virtual environment was not created successfully because ensurepip is not available." >&2; exit 1;;
esac;; esac
exec {sys.executable} "$@"
""")
    fake.chmod(0o755)
    return str(fake)


# No index and no proxy that leads anywhere, for this process and everything it starts.
OFFLINE = {"PIP_NO_INDEX": "1"} | {name: "http://127.0.0.1:9" for name in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy",
                                                                           "https_proxy")}


@pytest.fixture
def offline(monkeypatch):
    for name, value in OFFLINE.items():
        monkeypatch.setenv(name, value)


@pytest.fixture(scope="module")
def installed(house) -> tuple[Path, list[str]]:
    """Boot's environment made once from this Python (with ensurepip), offline; its venv and prepare's log."""
    lines: list[str] = []
    with pytest.MonkeyPatch.context() as patch:
        for name, value in OFFLINE.items():
            patch.setenv(name, value)
        prepare(sys.executable, house["root"] / "boot-env", house["wheels"], house["lock"], 300, log=lines.append)
    return house["root"] / "boot-env", lines


# ---------------------------------------------------------------------------------------------------- pure


@pytest.mark.parametrize("lock", sorted((REPO / "offline_wheels" / "locks").glob("*.txt")), ids=lambda p: p.stem)
def test_every_line_of_the_real_locks_is_parsed(lock):
    text = lock.read_text()
    versions = locked_versions(text)
    assert len(versions) == text.count("==") == len(locked_files(text))
    assert versions["packaging"] == "26.4" and all(name == name.lower() and "_" not in name for name in versions)
    assert all(file.endswith(".whl") for file in locked_files(text))


def test_a_line_that_is_not_name_equals_version_is_refused():
    with pytest.raises(ValueError, match="lock line 2"):
        locked_versions("a==1 --hash=sha256:00\nb>=2\n")
    with pytest.raises(ValueError, match="locked twice"):
        locked_versions("Foo_Bar==1\nfoo-bar==1\n")


def test_mismatches_one_line_per_locked_distribution_missing_or_other():
    locked = locked_versions("packaging==26.4\nrich==15.0.0\nTorch==2.13.0+cpu\nzeta==1\n")
    installed = {"packaging": "24.0", "rich": "15.0.0", "torch": "2.13.0+cpu", "pip": "23.2.1"}
    assert mismatches(locked, installed) == ["packaging: 24.0 installed, 26.4 locked", "zeta: not installed, 1 locked"]
    assert mismatches(locked, installed | {"packaging": "26.4", "zeta": "1"}) == []


def test_isolated_env_drops_what_leaks_the_image():
    env = isolated_env({"PATH": "/bin", "PYTHONPATH": "/image", "PIP_USER": "1", "PIP_INDEX_URL": "http://x",
                        "_PIP_RUNNING_IN_SUBPROCESS": "1", "VIRTUAL_ENV": "/v", "HTTPS_PROXY": "http://127.0.0.1:9"})
    assert env == {"PATH": "/bin", "HTTPS_PROXY": "http://127.0.0.1:9", "PIP_CONFIG_FILE": os.devnull,
                   "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_INPUT": "1"}


# ---------------------------------------------------------------------------------------------------- installs


def test_a_fresh_environment_holds_exactly_the_lock_offline(house, installed):
    venv, lines = installed
    python = venv / "bin" / "python"
    assert verify(python, house["lock"]) == []
    assert {k: v for k, v in installed_versions(python).items() if k in locked_versions(house["lock"])} == {
        "alpha": "1.0", "beta-pkg": "2.0", "gamma": "3.0"}
    assert imports(python) == {"alpha": "1.0", "beta_pkg": "2.0", "gamma": "3.0", "imageonly": None}
    assert ready(venv, house["lock"]) and not ready(venv, house["lock"] + "# another lock\n")
    assert any("installing the 3 locked wheels" in line for line in lines) and "verified" in lines[-1]


def test_a_seeded_image_keeps_its_versions_out_of_boot_environment(house, tmp_path, monkeypatch, offline):
    """The issue's case: the image's Python has Beta_Pkg 1.0 and gamma 2.5 (alpha's ranges accept both) and a package
    of its own in its site-packages, which is also on PYTHONPATH, and pip is told to install for the user from an
    index. Boot's environment, made from that very Python, holds exactly the locked versions and none of the image's
    packages."""
    image_python, site = system_python(tmp_path / "image")
    pip_into(image_python, "--find-links", house["image_wheels"], "beta-pkg==1.0", "gamma==2.5", "imageonly==0.1")
    assert imports(image_python)["gamma"] == "2.5" and (site / "gamma").is_dir()
    monkeypatch.setenv("PYTHONPATH", str(site))
    monkeypatch.setenv("PIP_USER", "1")
    monkeypatch.setenv("PIP_INDEX_URL", "http://127.0.0.1:9/simple")
    lines: list[str] = []
    python = prepare(str(image_python), tmp_path / "boot-env", house["wheels"], house["lock"], 300, log=lines.append)
    assert verify(python, house["lock"]) == []
    assert imports(python) == {"alpha": "1.0", "beta_pkg": "2.0", "gamma": "3.0", "imageonly": None}
    # The same seeded image with the install boot did before (top-level requirement only): the image's versions stay,
    # and verify says so, one line each. So does boot's environment if the solver ran with the image's PYTHONPATH.
    pip_into(image_python, "--find-links", house["wheels"], "alpha==1.0")
    assert verify(image_python, house["lock"]) == ["beta-pkg: 1.0 installed, 2.0 locked",
                                                   "gamma: 2.5 installed, 3.0 locked"]
    leaky = isolated_env(os.environ) | {"PYTHONPATH": str(site)}
    assert verify(python, house["lock"], env=leaky) == ["beta-pkg: 1.0 installed, 2.0 locked",
                                                       "gamma: 2.5 installed, 3.0 locked"]


def test_verify_reports_each_distribution_changed_after_install_and_prepare_heals_it(house, installed, tmp_path,
                                                                                    debian_python):
    venv, _ = installed
    copy = tmp_path / "tampered"
    python = copy_environment(venv, copy, hardlink=True)
    assert verify(python, house["lock"]) == []
    pip_into(python, "--find-links", house["image_wheels"], "gamma==2.5")
    run(python, "-m", "pip", "uninstall", "--yes", "--quiet", "beta-pkg")
    assert verify(python, house["lock"]) == ["beta-pkg: not installed, 2.0 locked", "gamma: 2.5 installed, 3.0 locked"]
    assert verify(venv / "bin" / "python", house["lock"]) == []  # the hard-linked source is untouched
    assert ready(copy, house["lock"])  # the stamp alone cannot tell: prepare verifies a reused environment
    lines: list[str] = []
    prepare(debian_python, copy, house["wheels"], house["lock"], 300, log=lines.append)
    assert "2 distribution(s) changed since (beta-pkg: not installed, 2.0 locked, ...): recreating it" in lines[0]
    assert verify(python, house["lock"]) == []


def test_a_copied_environment_is_reused_and_its_scripts_run_its_own_python(house, installed, tmp_path):
    venv, _ = installed
    plain = tmp_path / "plain"
    shutil.copytree(venv, plain, symlinks=True)
    # A plain copy: the interpreter works and imports from the copy, but pip's console script still runs the source.
    where = run(plain / "bin" / "python", "-c", "import gamma, sys; print(sys.prefix); print(gamma.__file__)")
    prefix, module = where.stdout.split()
    assert prefix == str(plain) and module.startswith(str(plain / "lib"))
    assert run(plain / "bin" / "alpha-where").stdout.strip() == str(venv)
    copy = tmp_path / "copy"
    copy_environment(venv, copy)
    assert run(copy / "bin" / "alpha-where").stdout.strip() == str(copy)
    assert run(venv / "bin" / "alpha-where").stdout.strip() == str(venv)
    assert "VIRTUAL_ENV" in (copy / "bin" / "activate").read_text() and str(venv) not in (
        copy / "bin" / "activate").read_text()
    lines: list[str] = []
    python = prepare(sys.executable, copy, house["wheels"], house["lock"], 60, log=lines.append)
    assert python == copy / "bin" / "python"
    assert lines == [f"environment: reusing {copy} (installed from this lock; 3 distributions verified)"]


def test_a_missing_wheel_fails_naming_it_and_a_corrupt_one_fails_with_pips_words(house, installed, tmp_path):
    empty = tmp_path / "empty"
    run(sys.executable, "-m", "venv", "--without-pip", empty)
    python = empty / "bin" / "python"
    pip = [sys.executable, "-m", "pip", "--python", str(python)]
    partial = tmp_path / "wheels"
    partial.mkdir()
    for wheel in house["wheels"].iterdir():
        if not wheel.name.startswith("gamma"):
            os.link(wheel, partial / wheel.name)
    lock = tmp_path / "lock.txt"
    lock.write_text(house["lock"])
    with pytest.raises(InstallError, match=f"missing from {partial}: gamma-3.0-py3-none-any.whl"):
        install_lock(python, partial, lock, 60, pip=pip)
    gamma = (house["wheels"] / "gamma-3.0-py3-none-any.whl").read_bytes()
    (partial / "gamma-3.0-py3-none-any.whl").write_bytes(gamma + b"corrupt")  # still a zip; another sha256
    with pytest.raises(InstallError, match=r"(?s)installing the lock from .*wheels failed.*DO NOT MATCH THE HASHES"):
        install_lock(python, partial, lock, 60, pip=pip)
    # pip checks hashes only of what it installs: an environment that already has gamma 3.0 takes the corrupt folder
    # without a word ("already satisfied"). So install_lock is for a new environment, as prepare uses it.
    install_lock(installed[0] / "bin" / "python", partial, lock, 60)
    # A pip that hangs (a real pip on three small wheels may finish inside the 1-s floor on an idle machine).
    hanging_pip = [sys.executable, "-c", "import time; time.sleep(60)"]
    with pytest.raises(InstallError, match="took over 1 s"):
        install_lock(python, house["wheels"], lock, 0.01, pip=hanging_pip)
    with pytest.raises(InstallError, match="missing from"):
        prepare(sys.executable, tmp_path / "never", partial.parent / "none", house["lock"], 60, log=lambda _: None)
    assert not (tmp_path / "never").exists()  # refused before the environment was made


def test_prepare_lists_every_mismatch_and_writes_no_stamp(house, tmp_path, monkeypatch, debian_python):
    """pip said it installed the lock, the environment says otherwise: every line in the error, no stamp."""
    monkeypatch.setattr(locked_install, "installed_versions", lambda python, env=None: {"alpha": "1.0", "gamma": "9"})
    with pytest.raises(InstallError) as error:
        prepare(debian_python, tmp_path / "env", house["wheels"], house["lock"], 300, log=lambda _: None)
    assert str(error.value).endswith("are not at their locked version:\nbeta-pkg: not installed, 2.0 locked\n"
                                     "gamma: 9 installed, 3.0 locked")
    assert not ready(tmp_path / "env", house["lock"])


def test_an_image_without_ensurepip_installs_with_its_own_pip(house, tmp_path, offline, debian_python):
    lines: list[str] = []
    python = prepare(debian_python, tmp_path / "boot-env", house["wheels"], house["lock"], 300, log=lines.append)
    assert any("has no ensurepip" in line for line in lines)
    assert verify(python, house["lock"]) == [] and ready(tmp_path / "boot-env", house["lock"])
    assert imports(python)["beta_pkg"] == "2.0"
