# expect: wrong timeout
# Prints a gigabyte before answering: output goes to /dev/null, never through the caller's memory.
def transform(grid):
    line = "x" * 1_000_000
    for _ in range(1_000):
        print(line)
    return [[1]]
