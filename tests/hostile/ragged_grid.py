# expect: invalid
def transform(grid):
    return [[1, 2], [3]]
