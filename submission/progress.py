"""One progress line that suits where it goes: redrawn in place on a terminal, whole lines in a log.

Progress written with `\r` turns into `trace 1/24trace 2/24...` once stderr is a file or a CI log. `ProgressLine`
redraws with `\r` only when the stream is a terminal; otherwise it writes one line per update, at most one every
`every_s` seconds (the last update always), so a long loop leaves a readable log.
"""

from __future__ import annotations

import sys
import time
from typing import Callable, TextIO


class ProgressLine:
    def __init__(self, stream: TextIO | None = None, every_s: float = 5.0,
                 clock: Callable[[], float] = time.monotonic):
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = bool(getattr(self.stream, "isatty", lambda: False)())
        self.every_s, self.clock = every_s, clock
        self._last_written = None
        self._width = 0
        self._pending = ""

    def update(self, text: str, final: bool = False) -> None:
        if self.terminal:
            self.stream.write("\r" + text.ljust(self._width))
            self._width = len(text)
            if final:
                self.stream.write("\n")
            self.stream.flush()
            return
        now = self.clock()
        if final or self._last_written is None or now - self._last_written >= self.every_s:
            self.stream.write(text + "\n")
            self.stream.flush()
            self._last_written, self._pending = now, ""
        else:
            self._pending = text

    def close(self) -> None:
        """End the line: on a terminal a newline, in a log the last update if it was held back."""
        if self.terminal:
            if self._width:
                self.stream.write("\n")
        elif self._pending:
            self.stream.write(self._pending + "\n")
        self._pending, self._width = "", 0
        self.stream.flush()
