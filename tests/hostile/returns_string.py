# expect: invalid
def transform(grid):
    return "the answer is [[1]]"
