"""`python -m build.quantize`: the quantiser's command line (build/quantize/quantizer.py says what it does)."""
import sys

from build.quantize.quantizer import main

if __name__ == "__main__":
    sys.exit(main())
