# expect: invalid
import numpy as np

def transform(grid):
    return np.full((3, 3), np.nan)
