# Keep the top-left 2x2 block.
def transform(grid):
    return [row[:2] for row in grid[:2]]
