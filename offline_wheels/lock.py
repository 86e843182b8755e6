"""Lock and fetch the wheels of a bundle target, with hashes, for installing with no network.

    python -m offline_wheels.lock --target cpu-py311            # resolve, write offline_wheels/locks/T.txt
    python -m offline_wheels.lock --target cpu-py311 --fetch    # download exactly the lock into the cache, verify

Resolving is `pip install --dry-run --report` with `--only-binary=:all: --platform ... --python-version ...
--implementation cp`: pip resolves for the target machine (not this one) from the wheels' metadata alone, so locking
the GPU targets does not download their several GB; the index gives each wheel's sha256. The lock lists every wheel
as `name==version --hash=sha256:...  # file`. Fetching downloads with `--require-hashes --no-deps` into
~/.cache/arc-kit/wheels/TARGET (outside the clone, reused between runs) and checks every file's sha256 against the
lock, then resolves the requirements from that folder alone (`--no-index`, the target's tags) as the offline install
will; `make wheels TARGET=...` runs it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from urllib.parse import unquote, urlparse

from submission import strict_toml

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "offline_wheels" / "locks"
CACHE = Path(os.environ.get("KIT_CACHE", Path.home() / ".cache" / "arc-kit")) / "wheels"


def target(name: str) -> dict:
    targets = strict_toml.read(ROOT / "offline_wheels" / "targets.toml")
    if name not in targets:
        raise SystemExit(f"error: unknown target {name!r}; targets: {', '.join(targets)}")
    return targets[name]


_LEGACY_MANYLINUX = {17: "manylinux2014", 12: "manylinux2010", 5: "manylinux1"}


def platform_tags(glibc: str, arch: str) -> list[str]:
    """Every platform tag pip accepts on a Linux machine with this glibc, most specific first.

    pip's `--platform` matches tags exactly, so a hand-picked list misses wheels (nvidia-nccl-cu13 ships only
    manylinux_2_18): this is the list pip itself builds on such a machine (PEP 600 tags from the glibc down to 2.5,
    the legacy aliases of 2.17, 2.12 and 2.5, then plain linux).
    """
    major, minor = (int(part) for part in glibc.split("."))
    if major != 2 or minor < 5:
        raise ValueError(f"glibc {glibc!r}: expected 2.N with N >= 5")
    tags = []
    for m in range(minor, 4, -1):
        tags.append(f"manylinux_2_{m}_{arch}")
        if m in _LEGACY_MANYLINUX:
            tags.append(f"{_LEGACY_MANYLINUX[m]}_{arch}")
    return tags + [f"linux_{arch}"]


def _platform_args(spec: dict) -> list[str]:
    args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", spec["python_version"]]
    for platform in platform_tags(spec["glibc"], spec["arch"]):
        args += ["--platform", platform]
    return args


def sha256(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-")


def wheel_requirement(path: Path) -> tuple[str, str]:
    m = _WHEEL.match(path.name)
    if not m:
        raise ValueError(f"{path}: not a wheel file name")
    return m.group("name").replace("_", "-").lower(), m.group("version")


def lock_lines(report: dict) -> list[str]:
    """The lock's lines from pip's installation report: one wheel per package, sorted, with its sha256."""
    lines = {}
    for item in report["install"]:
        info = item["download_info"]
        url = urlparse(info["url"])
        file = unquote(url.path.rsplit("/", 1)[-1])
        if not file.endswith(".whl"):
            raise ValueError(f"{info['url']}: not a wheel (the lock is binary only)")
        hashes = info.get("archive_info", {}).get("hashes", {})
        digest = hashes.get("sha256") or (sha256(Path(unquote(url.path))) if url.scheme == "file" else None)
        if digest is None:
            raise ValueError(f"{info['url']}: the index gave no sha256 for this wheel")
        package, version = wheel_requirement(Path(file))
        lines[file] = f"{package}=={version} --hash=sha256:{digest}  # {file}"
    return [lines[file] for file in sorted(lines)]


def lock(name: str) -> Path:
    spec = target(name)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.json"
        subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
                        "--target", str(Path(tmp) / "never-written"), "--report", str(report),
                        *_platform_args(spec), "-r", str(ROOT / spec["requirements"])], check=True)
        body = lock_lines(json.loads(report.read_text()))
    header = [f"# {name}: wheels for CPython {spec['python_version']} on {spec['arch']} Linux, glibc "
              f"{spec['glibc']}, resolved from {spec['requirements']}",
              f"# by python -m offline_wheels.lock --target {name}"]
    LOCKS.mkdir(parents=True, exist_ok=True)
    out = LOCKS / f"{name}.txt"
    out.write_text("\n".join(header + body) + "\n")
    return out


def locked(name: str) -> dict[str, str]:
    """File name -> sha256, from the lock."""
    path = LOCKS / f"{name}.txt"
    if not path.exists():
        raise SystemExit(f"error: {path} missing: run python -m offline_wheels.lock --target {name}")
    out = {}
    for line in path.read_text().splitlines():
        if line.startswith("#") or not line.strip():
            continue
        digest = line.split("--hash=sha256:")[1].split()[0]
        out[line.split("# ")[-1].strip()] = digest
    return out


def fetch(name: str) -> Path:
    """The target's wheels in the cache, verified against the lock; downloads only what is missing or wrong."""
    spec, expected = target(name), locked(name)
    folder = CACHE / name
    folder.mkdir(parents=True, exist_ok=True)
    missing = [f for f, digest in expected.items() if not (folder / f).exists() or sha256(folder / f) != digest]
    if missing:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--require-hashes",
                        "--dest", str(folder), *_platform_args(spec), "-r", str(LOCKS / f"{name}.txt")], check=True)
    bad = [f for f, digest in expected.items() if not (folder / f).exists() or sha256(folder / f) != digest]
    if bad:
        raise SystemExit(f"error: wheels missing or not matching {LOCKS / (name + '.txt')}: {bad}")
    return folder


def check_complete(name: str, folder: Path) -> None:
    """Resolve the target's requirements from the folder alone, with no index, as the target machine would.

    What the offline install on Kaggle will do, short of installing: a wheel the lock lacks fails here, on this
    machine, with pip's message naming it.
    """
    spec = target(name)
    # Only the folder: no pip configuration or PIP_* variable of this machine may add an index or a wheel folder.
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")} | {"PIP_CONFIG_FILE": os.devnull}
    with tempfile.TemporaryDirectory() as tmp:
        done = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed",
                               "--no-index", "--find-links", str(folder), "--target", str(Path(tmp) / "never-written"),
                               *_platform_args(spec), "-r", str(ROOT / spec["requirements"])],
                              capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"error: the wheels of {name} in {folder} do not install offline:\n{done.stderr.strip()}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m offline_wheels.lock", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--fetch", action="store_true", help="download the locked wheels into the cache and verify")
    args = parser.parse_args(argv)
    if args.fetch:
        folder = fetch(args.target)
        check_complete(args.target, folder)
        print(f"{folder}: every locked wheel present, hashes match, the requirements resolve from it offline")
    else:
        print(lock(args.target))


if __name__ == "__main__":
    main()
