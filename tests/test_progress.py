"""ProgressLine: in place on a terminal, whole lines (rate-limited, last one kept) in a log."""

from __future__ import annotations

import io

from submission.progress import ProgressLine


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_a_log_gets_whole_lines_never_carriage_returns():
    stream, now = io.StringIO(), [0.0]
    line = ProgressLine(stream, every_s=5.0, clock=lambda: now[0])
    for step in range(1, 25):
        now[0] = step * 1.0
        line.update(f"trace {step}/24")
    line.close()
    lines = stream.getvalue().splitlines()
    assert "\r" not in stream.getvalue()
    assert lines == ["trace 1/24", "trace 6/24", "trace 11/24", "trace 16/24", "trace 21/24", "trace 24/24"]


def test_a_final_update_is_written_at_once():
    stream = io.StringIO()
    line = ProgressLine(stream, every_s=60.0, clock=lambda: 0.0)
    line.update("step 1/2")
    line.update("step 2/2", final=True)
    line.close()
    assert stream.getvalue().splitlines() == ["step 1/2", "step 2/2"]


def test_a_terminal_redraws_one_line():
    stream = Terminal()
    line = ProgressLine(stream)
    line.update("trace 10/24")
    line.update("trace 9/9")
    line.close()
    assert stream.getvalue() == "\rtrace 10/24\rtrace 9/9  \n"
