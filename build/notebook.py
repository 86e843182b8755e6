"""Generate the Kaggle notebook (kaggle/notebook.ipynb) from its template: two cells, answer file first.

    python -m build.notebook [--out kaggle/notebook.ipynb]

Cell 1 writes a complete `[[0]]` submission.json from the competition's test file (found under /kaggle/input) before it
touches the kit's dataset, so every later failure (no dataset attached, a crash, a failed install) still leaves a
valid answer file. Cell 2 runs the bundle's boot script (kit/submission/boot.py) with the notebook's own start time,
puts the `[[0]]` file back if boot left a broken one, and on the commit run (not the rerun) raises when boot failed:
the rehearsal's verdict fails the commit loudly. ARC_KIT_INPUT and ARC_KIT_WORKING override /kaggle/input and
/kaggle/working (tests/test_notebook.py runs the cells that way).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ANSWER_CELL = '''# 1. A complete [[0]] submission.json from the competition's test file before anything else:
#    whatever fails later (no kit dataset attached, a crash, a failed install), a valid answer file is in place.
import glob, json, os, sys, time
STARTED = time.time()  # the deadline counts from the notebook's own start
INPUT = os.environ.get("ARC_KIT_INPUT", "/kaggle/input")
WORKING = os.environ.get("ARC_KIT_WORKING", "/kaggle/working")
RERUN = bool(os.environ.get("KAGGLE_IS_COMPETITION_RERUN"))
ANSWER = os.path.join(WORKING, "submission.json")


def write_answer(answers):
    os.makedirs(WORKING, exist_ok=True)
    with open(ANSWER + ".tmp", "w") as f:
        json.dump(answers, f)
    os.replace(ANSWER + ".tmp", ANSWER)


ZERO = None
found = sorted(glob.glob(os.path.join(INPUT, "**", "arc-agi_test_challenges.json"), recursive=True))
if found:
    with open(found[0]) as f:
        ZERO = {task_id: [{"attempt_1": [[0]], "attempt_2": [[0]]} for _ in task["test"]]
                for task_id, task in json.load(f).items()}
    write_answer(ZERO)
    print(f"wrote a [[0]] {ANSWER} for the {len(ZERO)} tasks of {found[0]}")
else:
    print(f"no arc-agi_test_challenges.json under {INPUT}: add the competition's data as an input "
          "(no answer file written)", file=sys.stderr)
'''
BOOT_CELL = '''# 2. Everything else happens in the kit dataset's boot script (kit/submission/boot.py): verify, install,
#    preflight, then the hidden set (rerun) or a rehearsal on a few public tasks (commit run). A failed rehearsal
#    fails the commit.
import subprocess
problem = None
bundles = sorted(glob.glob(os.path.join(INPUT, "**", "kit", "bundle.json"), recursive=True))
if not bundles:
    problem = f"no kit dataset (kit/bundle.json) under {INPUT}: add the bundle as an input"
else:
    bundle = os.path.dirname(os.path.dirname(bundles[0]))
    try:
        code = subprocess.run([sys.executable, os.path.join(bundle, "kit", "submission", "boot.py"), "--bundle",
                               bundle, "--input", INPUT, "--out-dir", WORKING, "--started", str(STARTED)]).returncode
        problem = f"boot.py exited with status {code} (its messages are above)" if code else None
    except OSError as err:
        problem = f"boot.py could not run: {err}"
if ZERO is not None:  # whatever boot did, the answer file stays complete
    try:
        with open(ANSWER) as f:
            written = json.load(f)
        complete = all(len(written.get(task_id, [])) == len(slots) for task_id, slots in ZERO.items())
    except (OSError, ValueError, AttributeError):
        complete = False
    if not complete:
        write_answer(ZERO)
        print("the answer file was missing or broken after boot: wrote the [[0]] file again", file=sys.stderr)
if problem:
    print(problem, file=sys.stderr)
    if not RERUN:
        raise RuntimeError(f"commit run failed: {problem}. submission.json is the [[0]] file.")
'''
CELLS = (ANSWER_CELL, BOOT_CELL)


def notebook() -> dict:
    return {"cells": [{"cell_type": "code", "execution_count": None, "metadata": {}, "outputs": [],
                       "source": cell.splitlines(keepends=True)} for cell in CELLS],
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
