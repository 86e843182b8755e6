"""Moved to build/prune/calibrate.py (issue 46): `python -m build.calibrate` runs it, for one release."""
import runpy
import sys

if __name__ == "__main__":
    print("build.calibrate moved to build.prune.calibrate; running it", file=sys.stderr)
    runpy.run_module("build.prune.calibrate", run_name="__main__", alter_sys=True)
