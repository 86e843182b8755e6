# Mirror top-bottom.
def transform(grid):
    return grid[::-1]
