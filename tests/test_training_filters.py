"""The trace filters on crafted traces: loops, give-ups, chat tags, and grids that only look like loops."""

from __future__ import annotations

import random

from submission.reasoning.prompt import grid_text
from training.filters import Trace, reason, select

LABEL = ((1, 2), (3, 4))


def prose(n: int, seed: int = 0) -> str:
    rng = random.Random(seed)
    words = ("the", "grid", "colour", "object", "moves", "left", "mirror", "rows", "count", "each", "blue", "red",
             "shape", "pattern", "output", "input", "corner", "border", "fill", "largest")
    return "\n".join(" ".join(rng.choice(words) for _ in range(rng.randint(6, 14))) + f" ({i})" for i in range(n))


def trace(thinking: str, answer: str = "1 2\n3 4\n", **kw) -> Trace:
    values = dict(task_id="t", test_index=0, split="training", thinking=thinking, answer=answer, natural=True,
                  grid=LABEL, label=LABEL)
    values.update(kw)
    return Trace(**values)


def test_a_good_trace_passes():
    assert reason(trace(prose(200))) is None


def test_sparse_grids_in_the_thinking_are_not_loops():
    sparse = tuple(tuple(5 if (r == 3 and c == 7) else 0 for c in range(30)) for r in range(30))
    thinking = prose(60) + "\n" + "\n".join([grid_text(sparse)] * 4) + "\n" + prose(60, seed=1)
    assert reason(trace(thinking)) is None


def test_loops_and_low_variety_are_dropped():
    loop = prose(50) + "\n" + "\n".join(["Wait, let me check the top left corner again."] * 6)
    assert reason(trace(loop)) == "a long line repeated"
    five = prose(50) + "\n" + "\n".join(["Wait, let me check the top left corner again."] * 5)
    assert reason(trace(five)) is None
    few = "\n".join(["ok", "hm", "so", "ok", "hm", "so", "ok", "hm", "so", "ok"])
    assert reason(trace(few)) == "too few unique lines"


def test_compression_of_a_loop_without_repeated_long_lines():
    looping = "\n".join(f"step {i % 7}: shift x{i % 3}" for i in range(400))
    assert reason(trace(looping)) in ("too few unique lines", "compresses like a loop")


def test_give_ups_chat_tags_forced_and_wrong_grids():
    assert reason(trace(prose(100) + "\nThis is my best guess.")) == "give-up phrase at the end"
    assert reason(trace("I'm stuck early on.\n" + prose(400))) is None  # not in the last 6,000 characters
    assert reason(trace(prose(100) + "<|im_start|>user")) == "chat tags inside"
    assert reason(trace(prose(100), natural=False)) == "forced completion"
    assert reason(trace(prose(100), grid=((0,),))) == "grid differs from the label"
    assert reason(trace("x" * 230_000)) == "too long"


def test_shortest_per_input_and_the_report():
    traces = [trace(prose(100 + 10 * i, seed=i), completion_tokens=1000 + i) for i in range(3)]
    traces += [trace(prose(100 + 10 * i, seed=i), test_index=1, split="evaluation", completion_tokens=900 + i)
               for i in range(3)]
    traces += [trace(prose(100), natural=False), trace(prose(100), grid=None)]
    kept, dropped = select(traces)
    assert [(t.test_index, t.completion_tokens) for t in kept] == [(0, 1000), (1, 900), (1, 901)]
    assert dropped == {"not among the shortest": 3, "forced completion": 1, "grid differs from the label": 1}
