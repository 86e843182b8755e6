"""What the notebook finds under /kaggle/input: the competition's files by the competition's mount name, the kit
dataset, and the `[[0]]` answer file that stands until the solver writes a better one. Standard library only (boot
imports it before any wheel is installed).

Why by name: with the 2024 competition's data attached as well, taking the first sorted `arc-agi_test_challenges.json`
wrote a 100-task answer file for a 240-task test set, and the commit rehearsal read 2024's evaluation file too (issue
27). Kaggle mounts a competition's data at /kaggle/input/<competition slug>/, so the competition's own mount is the
one whose path holds that slug (`COMPETITION`, configurable in the bundle). The commit run refuses a choice it cannot
make (several candidates, none under the competition's mount) with the paths in the message, so the team learns it
before a rerun is spent; the rerun never refuses: it takes the best candidate and logs which.

`choose` is pure; `find` and the answer-file helpers do the I/O.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

COMPETITION = "arc-prize-2025"  # the competition's slug: its data is mounted at /kaggle/input/<slug>/
TEST_FILE = "arc-agi_test_challenges.json"
EVALUATION_FILE = "arc-agi_evaluation_challenges.json"
EVALUATION_SOLUTIONS = "arc-agi_evaluation_solutions.json"
ZERO_SLOT = {"attempt_1": [[0]], "attempt_2": [[0]]}


@dataclass(frozen=True)
class Choice:
    """The file (or folder) taken, what to log about it, and why the commit run must stop ("" when it need not)."""

    path: Path | None
    note: str
    refusal: str = ""


def _listing(paths: list[Path]) -> str:
    return ", ".join(str(p) for p in paths)


def choose(found: list[Path], root: Path, competition: str, rerun: bool, what: str) -> Choice:
    """Which of `found` (paths under `root` called `what`) the run uses. Pure.

    One under the competition's mount (a folder named `competition` on its path below `root`): that one, whatever
    else is attached. None there: a single candidate is taken with a warning (it is not ambiguous); several are
    ambiguous, refused in the commit run and, in the rerun, the last in sorted order taken (of competition slugs
    that differ by year, the newest). Several under the competition's mount: the shallowest."""
    found = sorted(found)
    if not found:
        return Choice(None, f"no {what} under {root}")
    named = [p for p in found if competition in p.relative_to(root).parts[:-1]]
    others = [p for p in found if p not in named]
    if named:
        taken = min(named, key=lambda p: (len(p.parts), str(p)))
        also = f"; also attached, not used: {_listing(others)}" if others else ""
        return Choice(taken, f"{what}: {taken} (the competition's mount {competition}{also})")
    if len(found) == 1:
        return Choice(found[0], f"{what}: {found[0]} (warning: not under the competition's mount {competition}; "
                                "set the bundle's competition if this is another competition)")
    refusal = (f"{len(found)} files called {what} under {root} and none under the competition's mount "
               f"{competition}: {_listing(found)}; attach the competition {competition}, detach the others, or "
               "build the bundle with the competition's slug (make bundle COMPETITION=...)")
    taken = found[-1]
    return Choice(taken, f"{what}: {taken} (ambiguous, the last of {_listing(found)})", "" if rerun else refusal)


def find(root: Path, name: str, competition: str, rerun: bool) -> Choice:
    """`choose` over every file called `name` under `root`."""
    return choose(sorted(root.rglob(name)) if root.is_dir() else [], root, competition, rerun, name)


def zero_submission(tasks_path: Path) -> dict:
    """A complete answer file of [[0]] from the challenges file (or a directory of task files): one slot per test
    input, and one for a task whose "test" is missing or empty, so a broken task never breaks the file."""
    if tasks_path.is_dir():
        raw = {p.stem: json.loads(p.read_text()) for p in sorted(tasks_path.glob("*.json"))}
    else:
        raw = json.loads(tasks_path.read_text())
        if not isinstance(raw, dict):
            raise ValueError(f"{tasks_path}: expected a JSON object of tasks, got {type(raw).__name__}")
        if "train" in raw and "test" in raw:
            raw = {tasks_path.stem: raw}
    return {task_id: [dict(ZERO_SLOT) for _ in (_tests(task) or [None])] for task_id, task in raw.items()}


def _tests(task: object) -> list:
    tests = task.get("test") if isinstance(task, dict) else None
    return tests if isinstance(tests, list) else []


def _valid_grid(grid: object) -> bool:
    return (isinstance(grid, list) and 1 <= len(grid) <= 30 and all(isinstance(r, list) for r in grid)
            and 1 <= len(grid[0]) <= 30 and all(len(r) == len(grid[0]) for r in grid)
            and all(isinstance(c, int) and not isinstance(c, bool) and 0 <= c <= 9 for r in grid for c in r))


def _valid_slot(slot: object) -> bool:
    return isinstance(slot, dict) and all(_valid_grid(slot.get(k)) for k in ZERO_SLOT)


def merged(written: object, fallback: dict) -> tuple[dict, list[str]]:
    """The answer file to keep, task by task: the solver's answers for every task whose slots are all there and
    valid, the fallback's for the others (a task with another input count, a broken grid, a missing task). Returns
    it and the ids of the tasks taken from the fallback. Pure: one bad task never costs the others' answers."""
    written = written if isinstance(written, dict) else {}
    out, replaced = {}, []
    for task_id, slots in fallback.items():
        mine = written.get(task_id)
        if isinstance(mine, list) and len(mine) == len(slots) and all(_valid_slot(s) for s in mine):
            out[task_id] = mine
        else:
            out[task_id] = slots
            replaced.append(task_id)
    return out, replaced


def write_json(path: Path, data: dict) -> None:
    """Replace `path` atomically (readers see the old or the new file), mode 0644 like any file open() makes."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(data, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def keep_complete(answer: Path, fallback: dict) -> list[str]:
    """Make `answer` complete: tasks missing or broken in it take the fallback's [[0]] slots (`merged`). Returns the
    ids replaced (every id when the file is missing or not JSON); writes only when something was replaced."""
    try:
        written = json.loads(answer.read_text())
    except (OSError, ValueError):
        written = None
    out, replaced = merged(written, fallback)
    if replaced:
        write_json(answer, out)
    return replaced
