# expect: crash error timeout
# Raises the recursion limit and recurses until the C stack overflows (a segfault on most builds).
import sys

def transform(grid):
    sys.setrecursionlimit(10**8)

    def down(n):
        return down(n + 1) + 1

    return down(0)
