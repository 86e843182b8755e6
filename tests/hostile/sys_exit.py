# expect: error
# Raises SystemExit: a program error, not the end of the sandbox.
import sys

def transform(grid):
    sys.exit(3)
