# Shift everything down by one row.
def transform(grid):
    width = len(grid[0])
    return [[0] * width] + grid[:-1]
