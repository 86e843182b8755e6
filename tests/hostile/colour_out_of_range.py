# expect: invalid
def transform(grid):
    return [[1, 12], [3, -1]]
