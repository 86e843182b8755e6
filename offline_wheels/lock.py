"""Lock and fetch the wheels of a bundle target, with hashes, for installing with no network.

    python -m offline_wheels.lock --target cpu-py311            # resolve, download, write offline_wheels/locks/T.txt
    python -m offline_wheels.lock --target cpu-py311 --fetch    # download exactly the lock into the cache, verify

`pip download --only-binary=:all: --platform ... --python-version ... --implementation cp` resolves the target's
requirements for the target machine (not this one); the lock lists every wheel as `name==version --hash=sha256:...`.
Fetching downloads with `--require-hashes --no-deps` into ~/.cache/arc-kit/wheels/TARGET (outside the clone, reused
between runs) and checks every file's sha256 against the lock; `make wheels TARGET=...` runs it.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LOCKS = ROOT / "offline_wheels" / "locks"
CACHE = Path(os.environ.get("KIT_CACHE", Path.home() / ".cache" / "arc-kit")) / "wheels"


def target(name: str) -> dict:
    targets = tomllib.loads((ROOT / "offline_wheels" / "targets.toml").read_text())
    if name not in targets:
        raise SystemExit(f"error: unknown target {name!r}; targets: {', '.join(targets)}")
    return targets[name]


def _platform_args(spec: dict) -> list[str]:
    args = ["--only-binary=:all:", "--implementation", "cp", "--python-version", spec["python_version"]]
    for platform in spec["platforms"]:
        args += ["--platform", platform]
    return args


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


_WHEEL = re.compile(r"^(?P<name>[^-]+)-(?P<version>[^-]+)-")


def wheel_requirement(path: Path) -> tuple[str, str]:
    m = _WHEEL.match(path.name)
    if not m:
        raise ValueError(f"{path}: not a wheel file name")
    return m.group("name").replace("_", "-").lower(), m.group("version")


def lock(name: str) -> Path:
    spec = target(name)
    folder = CACHE / name
    folder.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--dest", str(folder), *_platform_args(spec),
                    "-r", str(ROOT / spec["requirements"])], check=True)
    lines = [f"# {name}: wheels for Python {spec['python_version']} ({', '.join(spec['platforms'][:2])}, ...),",
             f"# resolved from {spec['requirements']} by python -m offline_wheels.lock --target {name}"]
    for wheel in sorted(folder.glob("*.whl")):
        package, version = wheel_requirement(wheel)
        lines.append(f"{package}=={version} --hash=sha256:{sha256(wheel)}  # {wheel.name}")
    LOCKS.mkdir(parents=True, exist_ok=True)
    out = LOCKS / f"{name}.txt"
    out.write_text("\n".join(lines) + "\n")
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


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m offline_wheels.lock", description=__doc__.split("\n\n")[0])
    parser.add_argument("--target", required=True)
    parser.add_argument("--fetch", action="store_true", help="download the locked wheels into the cache and verify")
    args = parser.parse_args(argv)
    print(fetch(args.target) if args.fetch else lock(args.target))


if __name__ == "__main__":
    main()
