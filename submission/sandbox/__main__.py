"""`python -m submission.sandbox`: one program in the sandbox on a task (submission/sandbox/client.py)."""
import sys

from submission.sandbox.client import exit_quietly_on_closed_pipe, main

if __name__ == "__main__":
    sys.exit(exit_quietly_on_closed_pipe(main))
