# Plausible but wrong: only half of the colour substitution (one direction of each swap).
MAP = {1: 5, 2: 6, 3: 4, 8: 9}

def transform(grid):
    return [[MAP.get(c, c) for c in row] for row in grid]
