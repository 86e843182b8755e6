"""Benchmarks can fail: a missed target gives a non-zero exit; none of them writes to /proc/sys."""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "benchmarks"))

from targets import Targets, spread  # noqa: E402


def test_a_missed_target_fails_the_benchmark(capsys):
    targets = Targets()
    assert targets.at_least("ratio", 21.0, 20) and targets.at_most("ms per check", 3.3, 15)
    assert targets.exit_code() == 0
    assert not targets.at_least("ratio", 18.7, 20)
    assert targets.exit_code() == 1
    assert "target missed: ratio: 18.7 (>= 20) MISSED" in capsys.readouterr().out


def test_spread_is_the_median_and_range():
    assert spread([3.0, 1.0, 2.0]) == "2 (1-3)"


def test_no_benchmark_drops_the_page_cache():
    """Dropping the page cache as root measures the disk and disturbs everything else on the machine."""
    for script in (REPO / "benchmarks").glob("*.py"):
        assert "/proc/sys" not in script.read_text(), script.name
