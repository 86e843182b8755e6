# Mirror left-right.
def transform(grid):
    return [row[::-1] for row in grid]
