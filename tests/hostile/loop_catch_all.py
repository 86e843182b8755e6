# expect: timeout
# A loop that swallows every exception (an alarm-based timeout would be caught here; RLIMIT_CPU is a signal it cannot catch).
def transform(grid):
    while True:
        try:
            while True:
                pass
        except BaseException:
            continue
