# The input is a tile repeated twice, side by side or stacked: keep one tile.
def transform(grid):
    h, w = len(grid), len(grid[0])
    if all(row[: w // 2] == row[w // 2:] for row in grid) and w % 2 == 0:
        return [row[: w // 2] for row in grid]
    return grid[: h // 2]
