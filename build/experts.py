"""Moved to build/prune/experts.py (issue 46): `python -m build.experts` runs it, for one release."""
import runpy
import sys

if __name__ == "__main__":
    print("build.experts moved to build.prune.experts; running it", file=sys.stderr)
    runpy.run_module("build.prune.experts", run_name="__main__", alter_sys=True)
