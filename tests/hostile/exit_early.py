# expect: crash
# Leaves the interpreter without a result.
import os

def transform(grid):
    os._exit(0)
