"""Moved to build/models/grid_vocab.py (issue 46): `python -m build.grid_vocab` runs it, for one release."""
import runpy
import sys

if __name__ == "__main__":
    print("build.grid_vocab moved to build.models.grid_vocab; running it", file=sys.stderr)
    runpy.run_module("build.models.grid_vocab", run_name="__main__", alter_sys=True)
