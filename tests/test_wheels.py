"""offline_wheels: the platform tags a target accepts, the lock written from pip's report, the committed locks
against their requirements, and the offline completeness check (a missing wheel is named)."""

from __future__ import annotations

import re
import tomllib

import pytest

from offline_wheels.lock import LOCKS, ROOT, check_complete, fetch, lock_lines, locked, platform_tags, sha256

TARGETS = tomllib.loads((ROOT / "offline_wheels" / "targets.toml").read_text())


def test_platform_tags_are_what_pip_accepts_on_that_glibc():
    tags = platform_tags("2.35", "x86_64")
    assert tags[0] == "manylinux_2_35_x86_64" and tags[-1] == "linux_x86_64"
    # nvidia-nccl-cu13 ships only manylinux_2_18: a hand-picked list without it could not lock torch 2.14.
    for tag in ("manylinux_2_18_x86_64", "manylinux2014_x86_64", "manylinux2010_x86_64", "manylinux1_x86_64",
                "manylinux_2_5_x86_64"):
        assert tag in tags
    assert "manylinux_2_36_x86_64" not in tags and "manylinux_2_4_x86_64" not in tags
    minors = [int(t.split("_")[2]) for t in tags if t.startswith("manylinux_2_")]
    assert minors == sorted(minors, reverse=True)  # most specific first, as pip ranks them
    assert tags.index("manylinux2014_x86_64") == tags.index("manylinux_2_17_x86_64") + 1
    with pytest.raises(ValueError, match="2.N"):
        platform_tags("3.1", "x86_64")


def test_lock_lines_from_a_report(tmp_path):
    local = tmp_path / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl"
    local.write_bytes(b"not really a wheel")
    report = {"install": [
        {"download_info": {"url": "https://files.example/r/rich-15.0.0-py3-none-any.whl",
                           "archive_info": {"hashes": {"sha256": "ab" * 32}}}},
        {"download_info": {"url": local.as_uri()}},
    ]}
    assert lock_lines(report) == [
        f"rich==15.0.0 --hash=sha256:{'ab' * 32}  # rich-15.0.0-py3-none-any.whl",
        f"torch==2.13.0+cpu --hash=sha256:{sha256(local)}  # {local.name}",  # a local file: hashed here
    ]
    with pytest.raises(ValueError, match="no sha256"):
        lock_lines({"install": [{"download_info": {"url": "https://files.example/x-1-py3-none-any.whl"}}]})
    with pytest.raises(ValueError, match="not a wheel"):
        lock_lines({"install": [{"download_info": {"url": "https://files.example/x-1.tar.gz",
                                                   "archive_info": {"hashes": {"sha256": "cd" * 32}}}}]})


def _compatible(wheel: str, python_version: str, platforms: set[str]) -> bool:
    """pip's rule for CPython 3.N: cp3N with any ABI, cp3M-abi3 and py3M for M <= N, py3."""
    python_tags, abi, platform = wheel[:-len(".whl")].split("-")[-3:]
    minor = int(python_version.split(".")[1])

    def ok(tag: str) -> bool:
        if tag == "py3" or tag == f"cp3{minor}":
            return True
        older = tag[:3] in ("py3", "cp3") and tag[3:].isdigit() and int(tag[3:]) <= minor
        return older and (tag.startswith("py") or abi == "abi3")

    return any(map(ok, python_tags.split("."))) and any(t == "any" or t in platforms for t in platform.split("."))


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_committed_lock_matches_its_requirements_and_target(name):
    spec = TARGETS[name]
    lock = (LOCKS / f"{name}.txt").read_text()
    pins = {}
    for line in lock.splitlines():
        if line.startswith("#"):
            continue
        m = re.fullmatch(r"([a-z0-9-]+)==(\S+) --hash=sha256:([0-9a-f]{64})  # (\S+\.whl)", line)
        assert m, f"{name}: malformed lock line {line!r}"
        pins[m.group(1)] = m.group(2)
        assert _compatible(m.group(4), spec["python_version"], set(platform_tags(spec["glibc"], spec["arch"]))), \
            f"{name}: {m.group(4)} does not install on the target"
    assert len(locked(name)) == len(pins), f"{name}: a package is locked twice"
    for line in (ROOT / spec["requirements"]).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            package, version = line.split("==")
            assert pins.get(package.lower(), "").split("+")[0] == version, \
                f"{name}: lock is stale for {line} (run python -m offline_wheels.lock --target {name})"


def test_a_missing_wheel_is_named_by_the_offline_check(tmp_path):
    """Needs the CPU target's wheels (fetched on first use, about 500 MB; the offline boot test uses them too)."""
    folder = fetch("cpu-py311")
    check_complete("cpu-py311", folder)
    short = tmp_path / "wheels"
    short.mkdir()
    for wheel in folder.glob("*.whl"):
        if not wheel.name.startswith("rich-"):
            (short / wheel.name).symlink_to(wheel)
    with pytest.raises(SystemExit, match="(?s)do not install offline.*rich"):
        check_complete("cpu-py311", short)
