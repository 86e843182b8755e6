"""Moved to submission/sandbox/library.py (issue 46): `python -m submission.library` runs it, for one release."""
import runpy
import sys

if __name__ == "__main__":
    print("submission.library moved to submission.sandbox.library; running it", file=sys.stderr)
    runpy.run_module("submission.sandbox.library", run_name="__main__", alter_sys=True)
