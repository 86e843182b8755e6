"""Generate the Kaggle notebook (kaggle/notebook.ipynb) from its one template: a single cell that runs the bundle's
boot script (submission/boot.py) with the notebook's own start time.

    python -m build.notebook [--out kaggle/notebook.ipynb]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CELL = '''# ARC-AGI-2 offline kit: everything happens in the attached bundle's boot script (kit/submission/boot.py).
import glob, subprocess, sys, time
STARTED = time.time()  # the deadline counts from the notebook's own start
bundle = sorted(glob.glob("/kaggle/input/*/kit/bundle.json"))[0].rsplit("/kit/", 1)[0]
subprocess.run([sys.executable, f"{bundle}/kit/submission/boot.py", "--bundle", bundle, "--started", str(STARTED)])
'''


def notebook() -> dict:
    return {"cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                       "source": CELL.splitlines(keepends=True)}],
            "metadata": {"kernelspec": {"display_name": "Python 3", "language": "python", "name": "python3"},
                         "language_info": {"name": "python"}},
            "nbformat": 4, "nbformat_minor": 5}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m build.notebook", description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "kaggle" / "notebook.ipynb")
    args = parser.parse_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(notebook(), indent=1) + "\n")
    print(args.out)


if __name__ == "__main__":
    main()
