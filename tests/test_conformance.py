"""The conformance table (docs/conformance.md) against the shipped profiles: a profile value that changes without its
row changing, a key a profile sets without a row, or a departure without a reason fails here."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from submission.config import PROFILES, load_profile
from submission.grid import is_grid_profile
from submission.grid.config import load_grid_profile

TABLE = Path(__file__).resolve().parents[1] / "docs" / "conformance.md"
MATCHES = ("yes", "no", "unknown")


def tables(text: str) -> dict[str, list[list[str]]]:
    """Rows (setting, study, kit, match, why) under each `## NAME` heading."""
    out: dict[str, list[list[str]]] = {}
    name = ""
    for line in text.splitlines():
        if line.startswith("## "):
            name = line[3:].strip()
        elif line.startswith("| ") and not line.startswith(("| setting ", "| procedure ")) and name:
            out.setdefault(name, []).append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return out


def mismatches(rows: list[list[str]], profile_path: Path) -> list[str]:
    """What is wrong between one profile and its table rows; [] when they agree. Each line's profile is read by its
    own loader (a grid-line profile's defaults are the grid line's)."""
    profile = load_grid_profile(profile_path) if is_grid_profile(profile_path) else load_profile(profile_path)
    raw = tomllib.loads(profile_path.read_text())
    problems = []
    documented = set()
    for setting, _study, kit, match, why in rows:
        documented.add(setting)
        section, key = setting.split(".")
        actual = getattr(getattr(profile, section), key)
        actual = list(actual) if isinstance(actual, tuple) else actual
        expected = tomllib.loads(f"v = {kit}")["v"]
        if expected != actual or type(expected) is bool and type(actual) is not bool:
            problems.append(f"{setting}: the table says {kit}, the profile has {actual!r}")
        if match not in MATCHES:
            problems.append(f"{setting}: match must be one of {MATCHES}, not {match!r}")
        elif match != "yes" and not why:
            problems.append(f"{setting}: departs from the study ({match}) without a reason")
    for section, table in raw.items():
        if isinstance(table, dict):
            problems += [f"{section}.{key}: set by the profile, missing from the table" for key in table
                         if f"{section}.{key}" not in documented]
    return problems


def combined(path: Path) -> bool:
    return tomllib.loads(path.read_text()).get("line") == "both"


def shipped() -> list[Path]:
    """The profiles that reproduce a scored run, of both lines: the CPU demos (cpu-*, *-tiny) reproduce none, and a
    combined profile (line = "both") none either: the study ran the lines apart; its two profiles have their tables
    (test_a_combined_profile_runs_two_profiles_with_tables)."""
    return sorted(p for p in PROFILES.glob("*.toml")
                  if not p.stem.startswith("cpu-") and not p.stem.endswith("-tiny") and not combined(p))


@pytest.mark.parametrize("path", [p for p in PROFILES.glob("*.toml") if combined(p) and not p.stem.endswith("-tiny")],
                         ids=lambda p: p.stem)
def test_a_combined_profile_runs_two_profiles_with_tables(path):
    raw = tomllib.loads(path.read_text())
    known = tables(TABLE.read_text())
    for line in ("reasoning", "grid"):
        name = raw[line]["profile"]
        assert PROFILES / f"{name}.toml" in shipped(), f"{path}: {line}.profile {name} is not a shipped profile"
        assert name in known, f"{TABLE}: no table for {name}, which {path.stem} runs"


@pytest.mark.parametrize("path", shipped(), ids=lambda p: p.stem)
def test_every_shipped_profile_matches_its_table(path):
    rows = tables(TABLE.read_text()).get(path.stem)
    assert rows, f"{TABLE}: no table for the profile {path.stem}"
    assert mismatches(rows, path) == []


def test_a_changed_profile_value_or_an_undocumented_key_fails(tmp_path):
    path = PROFILES / "moe-4xL4.toml"
    rows = tables(TABLE.read_text())["moe-4xL4"]
    changed = tmp_path / "moe-4xL4.toml"
    changed.write_text(path.read_text().replace("mtp_speculative_tokens = 4", "mtp_speculative_tokens = 2")
                       .replace("max_in_flight = 56", "max_in_flight = 56\ncap_margin_tokens = 2000"))
    assert mismatches(rows, changed) == [
        "engine.mtp_speculative_tokens: the table says 4, the profile has 2",
        "schedule.cap_margin_tokens: the table says 3000, the profile has 2000"]
    unlisted = tmp_path / "unlisted.toml"
    unlisted.write_text(path.read_text() + "\n[sandbox]\ncpu_s = 5\n")
    assert mismatches(rows, unlisted) == ["sandbox.cpu_s: set by the profile, missing from the table"]
    silent = [row[:4] + [""] if row[0] == "engine.answer_max_tokens" else row for row in rows]
    assert mismatches(silent, path) == ["engine.answer_max_tokens: departs from the study (no) without a reason"]


def test_the_tables_name_real_settings():
    for name, rows in tables(TABLE.read_text()).items():
        if name == "Procedures":
            continue
        profile = load_grid_profile(name) if is_grid_profile(name) else load_profile(name)
        for row in rows:
            assert len(row) == 5, f"{TABLE}: {name}: a row needs 5 cells: {row}"
            section, key = row[0].split(".")
            assert key in {f.name for f in dataclasses.fields(getattr(profile, section))}, row[0]


def test_a_changed_grid_profile_value_fails(tmp_path):
    path = PROFILES / "grid-4b-4xL4.toml"
    rows = tables(TABLE.read_text())["grid-4b-4xL4"]
    changed = tmp_path / "grid-4b-4xL4.toml"
    changed.write_text(path.read_text().replace("cutoff = 0.2", "cutoff = 0.3").replace("max_failures = 3", ""))
    assert mismatches(rows, changed) == ["search.cutoff: the table says 0.2, the profile has 0.3"]  # a default: 3
    changed.write_text(path.read_text() + "threads = 2\n")  # [run] is the last section
    assert mismatches(rows, changed) == ["run.threads: set by the profile, missing from the table"]
