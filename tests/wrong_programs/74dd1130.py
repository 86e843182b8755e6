# Plausible but wrong: rotating instead of transposing.
import numpy as np

def transform(grid):
    return np.rot90(np.array(grid))
