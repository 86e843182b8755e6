"""Both lines in one run: run (the library: each line in its own process on its share of the GPUs, the merged answer
file, the combined heartbeat), __main__ (`python -m submission.both`, its command line). The merge rule of the two
lines' answers is submission.merge (the simulator uses it too).

One of the runs (tests/test_imports.py ROOMS): may import submission's core, the profiles (submission.profiles) and
submission.merge; it starts each line as a process (`python -m submission.main`, `python -m submission.grid.main`)
and imports neither line. Must not import submission/kaggle/, submission.main or submission.lines; build/, training/,
sim/.
"""
