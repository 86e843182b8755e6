# expect: invalid
# Returns a 1000x1000 array: larger than any ARC grid.
import numpy as np

def transform(grid):
    return np.zeros((1000, 1000), dtype=int)
