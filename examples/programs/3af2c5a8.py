# Mirror the grid into a 2x2 arrangement: original, left-right, top-bottom, both.
import numpy as np

def transform(grid):
    a = np.array(grid)
    top = np.hstack([a, a[:, ::-1]])
    return np.vstack([top, top[::-1]])
