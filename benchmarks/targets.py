"""The targets a benchmark must meet: each printed as met or MISSED, and a non-zero exit when one is missed.

A benchmark that prints a target and exits 0 when it is missed cannot fail; `make bench` stops at the first
benchmark that misses one. Also the one place for a measurement's spread: medians of interleaved repetitions.
"""

from __future__ import annotations

import statistics


def spread(values: list[float]) -> str:
    """Median (min-max) of repeated measurements, e.g. `21.7 (21.0-22.3)`."""
    return f"{statistics.median(values):.3g} ({min(values):.3g}-{max(values):.3g})"


class Targets:
    def __init__(self) -> None:
        self.missed: list[str] = []

    def check(self, name: str, value: float, bound: float, at_least: bool, unit: str = "") -> bool:
        met = value >= bound if at_least else value <= bound
        line = f"{name}: {value:.3g}{unit} ({'>=' if at_least else '<='} {bound:g}{unit}) {'met' if met else 'MISSED'}"
        print(line)
        if not met:
            self.missed.append(line)
        return met

    def at_least(self, name: str, value: float, bound: float, unit: str = "") -> bool:
        return self.check(name, value, bound, True, unit)

    def at_most(self, name: str, value: float, bound: float, unit: str = "") -> bool:
        return self.check(name, value, bound, False, unit)

    def exit_code(self) -> int:
        """0 when every target was met; else 1, after listing the missed ones."""
        for line in self.missed:
            print(f"target missed: {line}")
        return 1 if self.missed else 0
