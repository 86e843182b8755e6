# expect: invalid
def transform(grid):
    grid[0][0] = 1  # mutates in place and forgets to return
