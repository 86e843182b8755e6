"""Which of the model's own traces to train on (SPEC section 9): pure filters, each reporting what it dropped.

A trace is kept only if its grid equals the label; it completed naturally (thinking closed before the cap); it has no
chat tags inside; no give-up phrase in its last 6,000 characters; at most 220K characters; no line of >= 30
characters repeated >= 6 times; >= 60% of its lines unique; a zlib ratio (compressed / raw) >= 0.18. Repetition and
compression are measured on the text with grid rows removed: one sparse 30x30 grid written as text compresses 17:1,
more than a real loop (LIBRARIES.md). Then per test input the k shortest survive (1 for training tasks, 2 for
evaluation tasks).
"""

from __future__ import annotations

import re
import zlib
from collections import Counter
from dataclasses import dataclass, field

from submission.grids import Grid

CHAT_TAGS = ("<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>")
GIVE_UPS = ("best guess", "i'm stuck", "i am stuck", "give up", "i cannot determine", "can't figure",
            "cannot figure", "just guess", "i'll guess", "no clear pattern")
_GRID_ROW = re.compile(r"^[\s\[\](),0-9]*[0-9][\s\[\](),0-9]*$")


@dataclass(frozen=True)
class FilterConfig:
    max_chars: int = 220_000
    give_up_window: int = 6_000
    give_ups: tuple[str, ...] = GIVE_UPS
    repeat_min_chars: int = 30
    repeat_max: int = 5  # a line of >= 30 characters may appear at most this often (6 or more: a loop)
    min_unique_lines: float = 0.60
    min_zlib_ratio: float = 0.18
    keep_training: int = 1
    keep_evaluation: int = 2


@dataclass(frozen=True)
class Trace:
    task_id: str
    test_index: int
    split: str  # "training" or "evaluation": how many shortest traces an input keeps
    thinking: str  # the reasoning, without the closing </think>
    answer: str  # everything after </think> (grid, cue, program), without the final end of turn
    natural: bool
    grid: Grid | None
    label: Grid
    completion_tokens: int = 0
    payload: dict = field(default_factory=dict, compare=False)  # ids, records: carried along, not judged

    @property
    def chars(self) -> int:
        return len(self.thinking) + len(self.answer)


def without_grid_rows(text: str) -> list[str]:
    return [line for line in text.split("\n") if not _GRID_ROW.match(line)]


def _repeated(lines: list[str], config: FilterConfig) -> bool:
    long = Counter(line.strip() for line in lines if len(line.strip()) >= config.repeat_min_chars)
    return any(count > config.repeat_max for count in long.values())


def _unique_share(lines: list[str]) -> float:
    nonempty = [line.strip() for line in lines if line.strip()]
    return len(set(nonempty)) / len(nonempty) if nonempty else 1.0


def _zlib_ratio(text: str) -> float:
    raw = text.encode()
    return len(zlib.compress(raw, 9)) / len(raw) if raw else 1.0


def reason(trace: Trace, config: FilterConfig = FilterConfig()) -> str | None:
    """The first filter a trace fails, or None if it passes them all."""
    if trace.grid != trace.label:
        return "grid differs from the label"
    if not trace.natural:
        return "forced completion"
    if any(tag in trace.thinking or tag in trace.answer for tag in CHAT_TAGS):
        return "chat tags inside"
    tail = (trace.thinking + trace.answer)[-config.give_up_window:].lower()
    if any(phrase in tail for phrase in config.give_ups):
        return "give-up phrase at the end"
    if trace.chars > config.max_chars:
        return "too long"
    lines = without_grid_rows(trace.thinking)
    if _repeated(lines, config):
        return "a long line repeated"
    if _unique_share(lines) < config.min_unique_lines:
        return "too few unique lines"
    if _zlib_ratio("\n".join(lines)) < config.min_zlib_ratio:
        return "compresses like a loop"
    return None


def select(traces: list[Trace], config: FilterConfig = FilterConfig()) -> tuple[list[Trace], Counter]:
    """The traces to train on, and how many each filter dropped (in filter order, then 'not among the shortest')."""
    dropped: Counter = Counter()
    passed: dict[tuple[str, int], list[Trace]] = {}
    for trace in traces:
        why = reason(trace, config)
        if why is None:
            passed.setdefault((trace.task_id, trace.test_index), []).append(trace)
        else:
            dropped[why] += 1
    kept = []
    for group in passed.values():
        k = config.keep_evaluation if group[0].split == "evaluation" else config.keep_training
        group.sort(key=lambda t: (t.completion_tokens or t.chars, t.chars))
        kept += group[:k]
        dropped["not among the shortest"] += max(len(group) - k, 0)
    return kept, dropped
