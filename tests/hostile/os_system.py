# expect: wrong error
# Starts a shell command that would outlive the check.
import os

def transform(grid):
    os.system("sleep 987654 &")
    return [[1]]
