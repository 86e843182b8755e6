"""The solver. Its top floor is the core every line and the simulator share (grids, tasks, views, score, selection,
the answer file, attempts, the schedule, heartbeat, processes, strict_toml, cli), then the rooms: sandbox/, the
reasoning line (reasoning/ and engines/), the grid line (grid/), the profiles (profiles), the runs (reasoning/run,
grid/main, both, merge, lines, main) and the Kaggle runtime (kaggle/). The core imports no room; a room imports only
the ones below it that the README's layout table lists (tests/test_imports.py enforces it).
"""
