"""Moved to submission/kaggle/mounts.py (issue 46); a notebook generated before the move imports `keep_complete`
from here. Goes in the next release."""
from submission.kaggle.mounts import keep_complete  # noqa: F401
