# expect: error
# layers: seccomp
# Appends to a file and creates a new one beside it.
def transform(grid):
    open("$target", "a").write("more")
    open("$target.new", "x").write("new")
    return [[1]]
