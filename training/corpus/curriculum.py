"""A difficulty-filtered, curriculum-ordered sample of a corpus, and the check over it (issue 32, section 4).

    python -m training.corpus.curriculum sample --corpus DIR --out SAMPLE [--tasks 200] [--max-level 3]
                                                [--max-operations 5] [--budget 300] [--seed 0]
    python -m training.corpus.curriculum check SAMPLE

`sample` measures every training task of a generated corpus (`DIR/manifest.jsonl`, `DIR/tasks/`; `heldout/` is
never read) with `difficulty.measure`: composition depth, operation count and the leave-one-out pass rate of the
cheap solver (the first `--budget` single rules of `difficulty.search_order`). It keeps the tasks within the filter
(`--max-level`, `--max-operations`) whose test pair is as informative as the demonstrations and whose stages the
demonstrations show, draws up to `--tasks` of them by `--seed`, and writes them in curriculum order (level, then
operations, then name): `SAMPLE/tasks/<name>.json`, `SAMPLE/curriculum.jsonl` (one row per task: task, rule id,
family, rule, depth, operations, solver_pass, level, level_name) and `SAMPLE/sample.json` (the filter, the budget,
tasks per level, and the tasks left out by reason). `check` reads them back, measures every task again, and exits 1
listing each finding (a no-op or 1x1-only test pair, a stage no demonstration shows, a task beyond the filter, a
difficulty other than the one recorded), naming the file.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from training.corpus import difficulty, rules
from training.corpus.difficulty import Difficulty, Filter


class CurriculumError(ValueError):
    """A corpus or sample file that cannot be read; the message names the file (and line); the command exits 2."""


@dataclass(frozen=True)
class Entry:
    """One task of a corpus: its name, rule and pairs (five demonstrations, then the test)."""
    name: str
    rule: object
    rule_json: dict
    pairs: list


def verdict(entry: Entry, chosen: Filter, candidates: list) -> tuple[Difficulty, str, str]:
    """The task's difficulty, and why it is left out: a reason (weak_test, invisible or beyond_filter; "" when it
    is kept) and a sentence. Pure."""
    measured = difficulty.measure(entry.rule, entry.pairs, candidates)
    for reason, why in (("weak_test", difficulty.weak_test_pair(entry.pairs)),
                        ("invisible", difficulty.invisible_stage(entry.rule, entry.pairs[:-1])),
                        ("beyond_filter", chosen.beyond(measured))):
        if why:
            return measured, reason, why
    return measured, "", ""


def curriculum_row(entry: Entry, measured: Difficulty) -> dict:
    return {"task": entry.name, "rule_id": entry.name.rsplit("-", 1)[0], "family": entry.rule_json["family"],
            "rule": entry.rule_json, **measured.to_dict()}


def choose(entries: list[Entry], chosen: Filter, candidates: list, count: int, seed: int) -> tuple[list[dict], Counter]:
    """The sample's rows in curriculum order, and the left-out tasks counted by reason. Pure."""
    rows, left_out = [], Counter()
    for entry in entries:
        measured, reason, _ = verdict(entry, chosen, candidates)
        if reason:
            left_out[reason] += 1
        else:
            rows.append(curriculum_row(entry, measured))
    picked = sorted(np.random.default_rng(seed).permutation(len(rows))[:count].tolist())
    sample = [rows[i] for i in picked]
    return sorted(sample, key=lambda r: (r["level"], r["operations"], r["task"])), left_out


def findings(entries: list[Entry], recorded: list[dict], chosen: Filter, candidates: list) -> list[str]:
    """Every way the sample breaks its promise, one sentence each. Pure."""
    out = []
    for entry, row in zip(entries, recorded):
        measured, reason, why = verdict(entry, chosen, candidates)
        if reason:
            out.append(f"{entry.name}: {reason}: {why}")
        if measured.to_dict() != {k: row.get(k) for k in measured.to_dict()}:
            out.append(f"{entry.name}: difficulty {measured.to_dict()} differs from the recorded one")
    return out


# --- the shell: files in, files out ------------------------------------------------------------------------------

def _pairs(path: Path) -> list:
    try:
        data = json.loads(path.read_text())
        rows = data["train"] + data["test"]
        return [(np.array(r["input"], dtype=np.int8), np.array(r["output"], dtype=np.int8)) for r in rows]
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CurriculumError(f"{path}: not a task with train and test pairs that have outputs ({err!r})") from None


def _rows(path: Path, fields: tuple[str, ...]) -> list[dict]:
    rows = []
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise CurriculumError(f"{path}: {err.strerror}") from None
    for n, line in enumerate(lines, start=1):
        try:
            row = json.loads(line)
        except ValueError as err:
            raise CurriculumError(f"{path}:{n}: not JSON ({err})") from None
        missing = [f for f in fields if f not in row]
        if missing:
            raise CurriculumError(f"{path}:{n}: field {missing[0]!r} missing")
        rows.append(row)
    return rows


def read_corpus(folder: Path) -> list[Entry]:
    """The training tasks of a generated corpus, in manifest order."""
    manifest = folder / "manifest.jsonl"
    entries = []
    for n, row in enumerate(_rows(manifest, ("task", "split", "rule")), start=1):
        if row["split"] == "train":
            rule = rules.from_dict(row["rule"], f"{manifest}:{n}: rule")
            entries.append(Entry(row["task"], rule, row["rule"], _pairs(folder / "tasks" / f"{row['task']}.json")))
    return entries


def write_sample(out: Path, corpus: Path, rows: list[dict], summary: dict) -> None:
    (out / "tasks").mkdir(parents=True, exist_ok=True)
    for row in rows:
        (out / "tasks" / f"{row['task']}.json").write_text((corpus / "tasks" / f"{row['task']}.json").read_text())
    (out / "curriculum.jsonl").write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))
    (out / "sample.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")


def _sample(args) -> int:
    chosen = Filter(args.max_level, args.max_operations)
    entries = read_corpus(args.corpus)
    rows, left_out = choose(entries, chosen, difficulty.search_order(args.budget), args.tasks, args.seed)
    levels = Counter(difficulty.LEVELS[r["level"]] for r in rows)
    summary = {"corpus": str(args.corpus), "filter": {"max_level": chosen.max_level,
                                                      "max_operations": chosen.max_operations},
               "budget": args.budget, "seed": args.seed, "tasks": len(rows), "measured": len(entries),
               "levels": {name: levels.get(name, 0) for name in difficulty.LEVELS}, "left_out": dict(left_out)}
    write_sample(args.out, args.corpus, rows, summary)
    print("| level | tasks |\n| --- | --- |")
    for name, n in summary["levels"].items():
        print(f"| {name} | {n} |")
    print(f"{len(rows)} of {len(entries)} training tasks sampled to {args.out}; left out: {dict(left_out)}")
    if len(rows) < args.tasks:
        print(f"warning: {len(rows)} tasks within the filter, fewer than --tasks {args.tasks}", file=sys.stderr)
    return 0


def _check(args) -> int:
    summary_path = args.sample / "sample.json"
    try:
        summary = json.loads(summary_path.read_text())
        chosen, budget = Filter(**summary["filter"]), int(summary["budget"])
    except (OSError, ValueError, KeyError, TypeError) as err:
        raise CurriculumError(f"{summary_path}: no filter and budget to check against ({err!r})") from None
    path = args.sample / "curriculum.jsonl"
    recorded = _rows(path, ("task", "rule", "level", "operations", "solver_pass", "depth"))
    entries = [Entry(r["task"], rules.from_dict(r["rule"], f"{path}:{n}: rule"), r["rule"],
                     _pairs(args.sample / "tasks" / f"{r['task']}.json")) for n, r in enumerate(recorded, start=1)]
    found = findings(entries, recorded, chosen, difficulty.search_order(budget))
    for line in found:
        print(line)
    print(f"{len(entries)} tasks checked against {summary['filter']}: {len(found)} findings")
    return 1 if found else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.corpus.curriculum", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sample = sub.add_parser("sample", help="a filtered, curriculum-ordered sample of a corpus")
    sample.add_argument("--corpus", type=Path, required=True)
    sample.add_argument("--out", type=Path, required=True)
    sample.add_argument("--tasks", type=int, default=200)
    sample.add_argument("--max-level", type=int, default=3, choices=range(len(difficulty.LEVELS)))
    sample.add_argument("--max-operations", type=int, default=Filter().max_operations)
    sample.add_argument("--budget", type=int, default=difficulty.SEARCH_BUDGET)
    sample.add_argument("--seed", type=int, default=0)
    check = sub.add_parser("check", help="check a sample: exit 1 on any finding")
    check.add_argument("sample", type=Path)
    args = parser.parse_args(argv)
    try:
        return _sample(args) if args.command == "sample" else _check(args)
    except CurriculumError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
