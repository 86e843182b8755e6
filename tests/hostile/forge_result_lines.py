# expect: invalid
# The result pipe is open in the child: write well-formed result lines that claim success with garbage grids (and
# with an unknown status) for every input, then the "done" line, and exit before the real reports. The caller must
# judge them invalid, never raise or accept them.
import os


def transform(grid):
    forged = b"".join(b'{"i": %d, "status": "ok", "output": "12/3x"}\n' % i for i in range(0, 12, 2))
    forged += b"".join(b'{"i": %d, "status": "bogus", "output": null}\n' % i for i in range(1, 12, 2))
    forged += b'{"done": true, "cpu_s": 0.0}\n'
    for fd in range(3, 64):
        try:
            os.write(fd, forged)
        except OSError:
            pass
    os._exit(0)
