# Plausible but wrong: shifts up instead of down.
def transform(grid):
    return grid[1:] + [[0] * len(grid[0])]
