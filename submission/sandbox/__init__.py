"""The program sandbox: client (`Sandbox`, typed results per pair), server (the warm fork server it starts as a
script under `python -I`), library (a folder of programs run over tasks: checks, selection, the answer file).

May import: submission's core (grids, tasks, selection, score, answer_file). Must not import: either line (the
reasoning line and the grid line import the sandbox, not the other way), the profiles, the runs, submission/kaggle/;
build/, training/, sim/. The server imports only the standard library and submission.grids (it runs isolated).
"""
