"""Checkpoint surgery: tiny test checkpoints, routing statistics, expert lists, pruning (run from the repo root:
this regular package shadows the PyPI package `build` there, never install it)."""
