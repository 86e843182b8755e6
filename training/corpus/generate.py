"""Export: admitted rules -> gated tasks in ARC JSON, with a manifest (the shell around admission and the gate).

`python -m training.corpus generate --rules N --tasks-per-rule K --seed S --out DIR` writes
  DIR/tasks/<rule id>-<k>.json   ARC format: five "train" pairs and one "test" pair;
  DIR/heldout/<rule id>-<k>.json the same for held-out rules (5% of each family's admitted rules), kept apart;
  DIR/manifest.jsonl             one row per task: task, split, rule id, family, rule JSON, gate report, seed;
  DIR/gate.json                  the gate's rejections counted by reason.
A rule gets up to `tries` proposals per task; the nearest 8 admitted rules (raw behaviour distance) are the gate's
rivals. Each task's random stream is derived from (seed, rule id, k), so the same seed gives byte-identical files.
Composition and parallel workers are not built yet (README in this folder).
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from pathlib import Path

import numpy as np
from rich.progress import track

from training.corpus import admission, dsl, gate, scenes

NEAREST = 8
HELD_OUT = 0.05
SPLIT_DIRS = {"train": "tasks", "heldout": "heldout"}


def held_out(rules: list[dsl.Program], fraction: float = HELD_OUT) -> set[str]:
    """Ids of round(fraction x n) rules per family, chosen by a hash of the id: the choice depends only on which
    rules were admitted, never on the order or the seed.

    >>> rules = dsl.all_programs()[:40]
    >>> len(held_out(rules)), held_out(rules) == held_out(rules[::-1])
    (2, True)
    """
    chosen: set[str] = set()
    for family in sorted({r.family for r in rules}):
        ids = sorted((dsl.rule_id(r) for r in rules if r.family == family),
                     key=lambda i: hashlib.blake2b(f"heldout:{i}".encode(), digest_size=8).digest())
        chosen.update(ids[:round(fraction * len(ids))])
    return chosen


def task_json(pairs: list[gate.Pair]) -> dict:
    """ARC's task format: the first five pairs train, the last one tests.

    >>> x = np.array([[1]]); task_json([(x, x)] * 6)["test"]
    [{'input': [[1]], 'output': [[1]]}]
    """
    rows = [{"input": x.tolist(), "output": y.tolist()} for x, y in pairs]
    return {"train": rows[:-1], "test": rows[-1:]}


def task_rng(seed: int, rule: str, k: int, attempt: int) -> np.random.Generator:
    return np.random.default_rng([seed, int(rule[:15], 16), k, attempt])


def generate(rules: int, tasks_per_rule: int, seed: int, out: Path, tries: int = 3,
             programs: list[dsl.Program] | None = None) -> Counter:
    """Admit up to `rules` rules from `programs` (default: all of the family's) in a seeded order, then gate tasks
    for each. Returns the gate's verdicts counted by reason (plus no_scene)."""
    probes = scenes.probe_bank()
    programs = dsl.all_programs() if programs is None else programs
    adm = admission.Admitter(len(probes))
    admitted: list[dsl.Program] = []
    for i in np.random.default_rng(seed).permutation(len(programs)):
        if len(admitted) == rules:
            break
        program = programs[int(i)]
        if admission.admit_program(adm, program, probes).reason == "admitted":
            admitted.append(program)
    by_id = {dsl.rule_id(p): p for p in admitted}
    kept_apart = held_out(admitted)
    for folder in SPLIT_DIRS.values():
        (out / folder).mkdir(parents=True, exist_ok=True)
    counts: Counter = Counter()
    manifest = []
    for row, program in enumerate(track(admitted, description="gating")):
        rid = dsl.rule_id(program)
        rivals = [by_id[r] for r in adm.nearest(row, NEAREST)]
        for k in range(tasks_per_rule):
            for attempt in range(tries):
                try:
                    pairs = gate.make_task(program, task_rng(seed, rid, k, attempt), probes, rivals)
                except ValueError:  # the scene generator found no unambiguous input for this rule
                    counts["no_scene"] += 1
                    break
                report = gate.judge_task(program, pairs, probes, rivals)
                counts[report.reason] += 1
                if report.accepted:
                    name = f"{rid}-{k}"
                    split = "heldout" if rid in kept_apart else "train"
                    (out / SPLIT_DIRS[split] / f"{name}.json").write_text(json.dumps(task_json(pairs)) + "\n")
                    manifest.append({"task": name, "split": split, "rule_id": rid, "family": program.family,
                                     "rule": dsl.to_dict(program), "gate": report.reason, "seed": seed})
                    break
    (out / "manifest.jsonl").write_text("".join(json.dumps(m, sort_keys=True) + "\n" for m in manifest))
    (out / "gate.json").write_text(json.dumps({"seed": seed, "rules": len(admitted), "verdicts": dict(
        sorted(counts.items()))}, indent=2) + "\n")
    return counts
