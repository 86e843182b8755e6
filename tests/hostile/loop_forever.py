# expect: timeout
# An infinite loop: the CPU limit ends it.
def transform(grid):
    while True:
        pass
