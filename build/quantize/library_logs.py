"""compressed-tensors logs through loguru at DEBUG by default (a line per file it copies), which drowns the kit's own
output in `make prune-demo` and `make bundle`: the build commands show its INFO and above only."""

from __future__ import annotations

import sys


def show_library_logs_from(level: str = "INFO") -> None:
    """Route loguru (compressed-tensors' logger) to stderr at `level` and above; called by command lines only."""
    from loguru import logger

    logger.remove()
    logger.add(sys.stderr, level=level, format="{level}: {message}")
