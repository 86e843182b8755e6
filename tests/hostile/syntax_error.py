# expect: error
def transform(grid)
    return grid
