# Rotate 90 degrees counter-clockwise.
import numpy as np

def transform(grid):
    return np.rot90(np.array(grid)).tolist()
