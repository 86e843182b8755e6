"""A table row's quote against the STUDY.md lines it cites: the row's words must be the study's, and its value must be
readable from them.

STUDY.md keeps each excerpted line of the seed document with its number (` 2489  text`). A row that cites lines
(`seed`) carries `quote`, a short run of the study's words as extracted from those lines (the cited lines are read as
one text, joined by single spaces, so a quote may run across a line break; spacing is compared collapsed). The study
value must then be readable from the quote (`readable`): a number as the extraction writes it (`5 _._ 5` is 5.5,
`10 _[−]_ [4]` is 0.0001, `56,000` and `56K` are 56000, `15 minutes` is 900 s, `12 hours` / `12-hour` 43200 s,
`10%` 0.1, `7.7 GiB` bytes, `1 GiB` 1024 MiB, `three` 3), each element of a list, a string as words of the quote
(case and `_` aside). A value
that no quote can show (a yes or no, a name the study does not spell) needs `reading`: the row says how the quote
gives it. Feature rows carry prose, not values: their quote is checked against the lines only.

This is what catches a row that cites an unrelated line, and a wrong value written into both a profile and its
table (the run agrees with the table, but the quote does not give the value).
"""

from __future__ import annotations

import math
import re
from typing import Any

LINE = re.compile(r"^ ?(\d{4})  (.*)$", re.MULTILINE)
# A unit after a number: what the number then stands for (GiB: bytes or MiB; times in seconds).
UNITS = {"k": (1000.0,), "min": (60.0,), "minute": (60.0,), "minutes": (60.0,), "h": (3600.0,), "hour": (3600.0,),
         "hours": (3600.0,), "%": (0.01,), "gib": (float(1 << 30), 1024.0), "s": (1.0,), "seconds": (1.0,)}
NUMBER = re.compile(r"(\d+(?:\.\d+)?(?:e-\d+)?)(?:-|\s*)(K\b|%|GiB\b|minutes?\b|min\b|hours?\b|h\b|seconds\b|s\b)?")
WORDS = {w: str(n) for n, w in enumerate("zero one two three four five six seven eight nine ten eleven twelve".split())}


def study_lines(study_text: str) -> dict[int, str]:
    """STUDY.md's excerpted lines by their number in the seed document."""
    return {int(n): text for n, text in LINE.findall(study_text)}


def collapsed(text: str) -> str:
    return " ".join(text.split())


def cited_text(lines: dict[int, str], seed: tuple[int, ...]) -> str:
    return collapsed(" ".join(lines.get(n, "") for n in sorted(seed)))


def _extracted(text: str) -> str:
    """The PDF extraction's spellings of numbers, written plainly: `5 _._ 5` -> 5.5, `5 _×_ 10 _[−]_ [5]` -> 5e-05,
    `10 _[−]_ [4]` -> 1e-04, thousands separators dropped; the numbers one to twelve spelled out as digits."""
    text = re.sub(r"\b(" + "|".join(WORDS) + r")\b", lambda m: WORDS[m.group(1)], text, flags=re.IGNORECASE)
    text = re.sub(r"(\d) _\._ (\d)", r"\1.\2", text)
    text = re.sub(r"(?:(\d+(?:\.\d+)?) _×_ )?10 _\[−\]_ \[(\d+)\]",
                  lambda m: repr(float(m.group(1) or 1) * 10.0 ** -int(m.group(2))), text)
    return re.sub(r"(?<=\d),(?=\d{3}\b)", "", text)


def numbers(quote: str) -> list[float]:
    """Every value a number of the quote can stand for: itself, or scaled by the unit that follows it (56K is 56000,
    not 56)."""
    out = []
    for m in NUMBER.finditer(_extracted(quote)):
        value = float(m.group(1))
        out += [value * unit for unit in UNITS[m.group(2).lower()]] if m.group(2) else [value]
    return out


def readable(value: Any, quote: str) -> bool:
    """Whether the study value can be read from the quote (module doc); never for a boolean."""
    if isinstance(value, bool):
        return False
    if isinstance(value, list):
        return bool(value) and all(readable(v, quote) for v in value)
    if isinstance(value, (int, float)):
        return any(math.isclose(value, n, rel_tol=1e-6, abs_tol=0.5 if abs(value) >= 1 << 30 else 0.0)
                   for n in numbers(quote))
    if isinstance(value, str):
        plain = lambda s: collapsed(s.replace("_", " ").lower())  # noqa: E731
        return bool(value.strip()) and plain(value) in plain(quote)
    return False


def problems(where: str, row: Any, lines: dict[int, str]) -> list[str]:
    """What is wrong with one row's quote; [] for a row that cites no STUDY.md line."""
    if not row.seed:
        return [f"{where}: {row.setting}: a quote without the lines it is from (seed)"] if row.quote else []
    if not row.quote:
        return [f"{where}: {row.setting}: cites STUDY.md {list(row.seed)} without the study's words (quote)"]
    text = cited_text(lines, row.seed)
    if collapsed(row.quote) not in text:
        return [f"{where}: {row.setting}: the quote {row.quote!r} is not in STUDY.md lines {list(row.seed)}"]
    kind = row.setting.split(".")[0]
    if kind == "feature" or row.reading or row.study is None:
        return []
    value = row.study
    if readable(value, row.quote):
        return []
    return [f"{where}: {row.setting}: the study value {value!r} cannot be read from the quote {row.quote!r}: "
            "quote the words that give it, or say how they do (reading)"]


def inside(seed: tuple[int, ...], passages: tuple[tuple[int, int], ...]) -> tuple[int, ...]:
    """The cited lines that lie in the run's passages."""
    return tuple(n for n in seed if any(a <= n <= b for a, b in passages))


def run_problems(where: str, row: Any, lines: dict[int, str], passages: tuple[tuple[int, int], ...]) -> list[str]:
    """Whether a row's quote comes from its own run's lines (module doc); [] for a row without a quote."""
    if not row.quote:
        return []
    own = collapsed(row.quote) in cited_text(lines, inside(row.seed, passages))
    spans = ", ".join(f"{a}-{b}" for a, b in passages)
    if own and row.borrowed:
        return [f"{where}: {row.setting}: the quote is from this run's passages ({spans}) but the row says it is "
                "borrowed: remove borrowed"]
    if not own and not row.borrowed:
        return [f"{where}: {row.setting}: the quote {row.quote!r} is from STUDY.md {list(row.seed)}, outside this "
                f"run's passages ({spans}): cite the run's own lines, or say why these words give its value (borrowed)"]
    return []
