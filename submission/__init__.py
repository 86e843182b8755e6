"""The solver. Its top floor is the core every line and the simulator share (grids, tasks, views, score, selection,
the answer file, attempts, the schedule, heartbeat, processes, progress, engine_numbers, strict_toml, cli), then the
rooms: sandbox/, the reasoning line (reasoning/, its engines in reasoning/engines/), the grid line (grid/), the
profiles (profiles), the runs (reasoning/run, grid/run, both/run, merge, lines: libraries), the entries users type
(main, grid/main, both/__main__) and the Kaggle runtime (kaggle/); the old paths of moved modules stay as aliases for
one release (boot, preflight, kaggle_mounts, library). The core imports no room; a room imports only the ones below it
that submission/README.md's table lists (tests/test_imports.py enforces it). Must not import: build/, training/,
sim/ (they import the solver, never the other way).
"""
