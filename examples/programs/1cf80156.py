# Crop to the bounding box of the non-background cells.
import numpy as np

def transform(grid):
    a = np.array(grid)
    rows, cols = np.nonzero(a)
    return a[rows.min():rows.max() + 1, cols.min():cols.max() + 1]
