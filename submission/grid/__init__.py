"""The grid-model line (SPEC section 10): a model with a 16-token vocabulary that writes grids directly, adapted to
each task at test time (ttt), searched depth-first (dfs), rescored under fresh views (rescore), run by one worker per
device on a shared queue (queue, workers); profile (the line's profile types), format (the grid formats), model (the
model in transformers, with its adapter), solve (one task); run (the line's run) and main (its command line). Beside
the reasoning line in one run, answers merged (submission.both, submission.merge).

May import: submission's core. Must not import: the reasoning line, the sandbox, submission/kaggle/, build/,
training/, sim/. Only `run` (the line's run, a library) and `main` (its command line) stand on the profiles
(submission.profiles): they are rooms above the rest of this folder (tests/test_imports.py).
"""
