"""Moved to build/prune/adoption.py (issue 46): `python -m build.adoption` runs it, for one release."""
import runpy
import sys

if __name__ == "__main__":
    print("build.adoption moved to build.prune.adoption; running it", file=sys.stderr)
    runpy.run_module("build.prune.adoption", run_name="__main__", alter_sys=True)
