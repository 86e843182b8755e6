# expect: error
# layers: seccomp
# Deletes a file.
import os

def transform(grid):
    os.remove("$target")
    return [[1]]
