# expect: error
# layers: seccomp
# A real fork bomb: seccomp refuses the first fork (without seccomp this one is not run: see stray_children.py).
import os

def transform(grid):
    while True:
        os.fork()
