"""`python -m build.prune`: the pruner's command line (build/prune/pruner.py says what it does)."""
import sys

from build.prune.pruner import main

if __name__ == "__main__":
    sys.exit(main())
