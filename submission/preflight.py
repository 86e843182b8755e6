"""Moved to submission/kaggle/preflight.py (issue 46): `python -m submission.preflight` runs it, for one release."""
import runpy
import sys

if __name__ == "__main__":
    print("submission.preflight moved to submission.kaggle.preflight; running it", file=sys.stderr)
    runpy.run_module("submission.kaggle.preflight", run_name="__main__", alter_sys=True)
