# expect: crash
# Writes 100 MB straight into every inherited file descriptor, the result pipe among them: the byte cap stops reading.
import os

def transform(grid):
    junk = b"x" * (1 << 20)
    for fd in range(3, 64):
        try:
            for _ in range(100):
                os.write(fd, junk)
        except OSError:
            pass
    return [[1]]
