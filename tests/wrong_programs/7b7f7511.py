# Plausible but wrong: always halves the width, also for tiles stacked vertically.
def transform(grid):
    return [row[: len(row) // 2] for row in grid]
