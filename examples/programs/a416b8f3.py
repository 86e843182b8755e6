# Repeat the grid twice side by side.
def transform(grid):
    return [row + row for row in grid]
