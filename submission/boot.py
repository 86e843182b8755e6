"""Moved to submission/kaggle/boot.py (issue 46); this alias runs it and goes in the next release.

    python kit/submission/boot.py ...   (a notebook generated before the move)
"""
import os
import runpy
import sys

if __name__ == "__main__":
    print("submission/boot.py moved to submission/kaggle/boot.py; running it", file=sys.stderr)
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    runpy.run_module("submission.kaggle.boot", run_name="__main__", alter_sys=True)
