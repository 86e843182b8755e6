# Plausible but wrong: a left-right mirror instead of the 180-degree rotation.
def transform(grid):
    return [row[::-1] for row in grid]
