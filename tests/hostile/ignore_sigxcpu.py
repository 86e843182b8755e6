# expect: timeout
# Ignores the soft CPU-limit signal: the hard limit's SIGKILL follows one second later.
import signal

def transform(grid):
    signal.signal(signal.SIGXCPU, signal.SIG_IGN)
    while True:
        pass
