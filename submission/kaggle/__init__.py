"""The Kaggle runtime: what runs only in the Kaggle box (and what the bundle builder prepares for it).

boot (the notebook's entry: verify, install, preflight, the supervised solver), supervise (relaunch with --resume after
a crash or a hang), locked_install (boot's own environment from the lock's wheels), bundle_files (the dataset as
mounted, the manifest), mounts (the competition's files by their mount name, the `[[0]]` answer file), preflight
(the machine and the bundle against the profile).

May import: submission's core (the top-level modules) and the profiles (submission.profiles and the lines' profile
types, for preflight). Must not import: the runs (submission.reasoning.run, submission.grid.run, submission.both,
submission.lines), the entries (submission.main, submission.grid.main) or the engines; build/, training/, sim/. boot,
mounts, bundle_files, locked_install and supervise stay standard-library only: boot runs them before its environment is
installed.
"""
