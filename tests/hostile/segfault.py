# expect: crash
# Dereferences a null pointer.
import ctypes

def transform(grid):
    return ctypes.string_at(0)
