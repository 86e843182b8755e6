# expect: error
# layers: seccomp
# Renames a file.
import os

def transform(grid):
    os.rename("$target", "$target.moved")
    return [[1]]
