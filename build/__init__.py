"""Checkpoint surgery and the offline bundle: test checkpoints, routing statistics, expert lists, pruning,
quantisation, the end-of-turn patch, the likelihood check, the Kaggle dataset (build/README.md lists the modules).
Run from the repo root: this regular package shadows the PyPI package `build` there; never install it."""
