"""Moved to build/bundle/notebook.py (issue 46): `python -m build.notebook` runs it, for one release."""
import runpy
import sys

if __name__ == "__main__":
    print("build.notebook moved to build.bundle.notebook; running it", file=sys.stderr)
    runpy.run_module("build.bundle.notebook", run_name="__main__", alter_sys=True)
