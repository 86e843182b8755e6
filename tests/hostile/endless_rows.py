# expect: timeout invalid
# A list subclass whose iteration never ends: validation itself runs under the CPU limit.
class Endless(list):
    def __iter__(self):
        while True:
            yield [1]

def transform(grid):
    return Endless([[1], [1]])
