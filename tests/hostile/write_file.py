# expect: error
# layers: seccomp
# Overwrites a file that its permissions would allow it to write.
def transform(grid):
    with open("$target", "w") as f:
        f.write("overwritten")
    return [[1]]
