"""The grid-model line (SPEC section 10): a model with a 16-token vocabulary that writes grids directly, adapted to
each task at test time (ttt), searched depth-first (dfs), rescored under fresh views (rescore), run by one worker per
device on a shared queue (workers, main); beside the reasoning line in one run, answers merged (submission.both,
submission.merge).

May import: submission's core. Must not import: the reasoning line, the sandbox, submission/kaggle/, build/,
training/, sim/. Only `main` (the line's run and its command) stands on the profiles (submission.profiles): it is a
room above the rest of this folder (tests/test_imports.py).
"""
