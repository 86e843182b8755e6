"""`python -m build.bundle`: the bundler's command line (build/bundle/bundler.py says what it does)."""
import sys

from build.bundle.bundler import main

if __name__ == "__main__":
    sys.exit(main())
