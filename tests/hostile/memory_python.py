# expect: error timeout
# Grows a pure-Python list until the address-space limit refuses (MemoryError) or, where page faults are slow,
# the CPU limit comes first.
def transform(grid):
    hoard = []
    while True:
        hoard.append([0] * 1_000_000)
