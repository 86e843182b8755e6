"""Moved to build/models/tiny.py (issue 46): `python -m build.tiny` runs it, for one release."""
import runpy
import sys

if __name__ == "__main__":
    print("build.tiny moved to build.models.tiny; running it", file=sys.stderr)
    runpy.run_module("build.models.tiny", run_name="__main__", alter_sys=True)
