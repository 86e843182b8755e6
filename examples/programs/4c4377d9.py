# Stack the upside-down grid on top of the original.
def transform(grid):
    return grid[::-1] + grid
