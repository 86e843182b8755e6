# expect: wrong error
# Leaves children behind, one of them in its own session (escaping the process group); all must be gone after the check.
import os
import time

def transform(grid):
    for _ in range(20):
        if os.fork() == 0:
            time.sleep(1000)
            os._exit(0)
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(1000)
        os._exit(0)
    return [[1]]
