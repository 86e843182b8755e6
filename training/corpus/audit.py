"""Audit a generated corpus: replay every gate from the files alone, and look for leaks of public ARC data.

`python -m training.corpus audit DIR [--arc-data ../shared/arc-data] [--workers 2] [--address ADDR]` (exit status 1
on any finding). The expensive parts run as Ray tasks over shards (cluster.py): the rules' behaviours on the probe
bank, the keys of the ARC files, and the replay, gate and keys of the corpus's tasks, SHARD items a task; the
driver only looks keys up and picks rivals from the block index (admission.Admitter.nearest), so each shard's work
does not grow with the corpus.
Replay: each task's rule is read from the manifest. The oracle must reproduce every pair, and the gate must accept
again, with rivals = the 8 nearest rules of the manifest by raw behaviour on the probe bank and the rule's kin in the
manifest (`compose.kin`), as generate picks them. (The generator's rivals
came from the whole admitted set. Rules admitted without a task are not in the manifest, so this replay is
approximate.)
Held-out rules keep all of their tasks in the held-out folder (a rule with tasks in both splits is a finding).
Leakage: every input, every pair and every task is reduced to a key that ignores the eight symmetries of the square
and the colour names. Colours are renumbered by first appearance, row by row, after the symmetry; a pair is
transformed as a whole, so input and output share one symmetry and one renumbering. A key found in any task of the
ARC folder (ARC-AGI-1, ARC-AGI-2, ConceptARC: every JSON file under it) is a leak. A task's key is the sorted list of
its pair keys.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from rich.progress import track

from training.corpus import admission, cluster, compose, gate, generate, oracle, rules
from training.corpus.generate import NEAREST, SPLIT_DIRS, rivals as rivals_of

SHARD = 16  # items per Ray task: rules, ARC files or corpus tasks


def canonical_key(grids: tuple[np.ndarray, ...]) -> bytes:
    """16 bytes naming `grids` up to one shared symmetry and one shared renaming of colours.

    >>> a = np.array([[1, 2], [3, 3]]); b = np.array([[7, 7], [5, 4]])  # b: a turned 180 degrees, renamed
    >>> canonical_key((a,)) == canonical_key((b,)), canonical_key((a,)) == canonical_key((a.T,))
    (True, True)
    >>> canonical_key((a,)) == canonical_key((np.array([[1, 2], [2, 3]]),))  # equal colours on a diagonal
    False
    """
    best = None
    for g in range(8):
        moved = [admission.dihedral(np.asarray(x), g) for x in grids]
        flat = np.concatenate([m.ravel() for m in moved])
        colours, first = np.unique(flat, return_index=True)
        rename = np.zeros(max(int(flat.max()) + 1, 10), dtype=np.uint8)
        rename[colours[np.argsort(first)]] = np.arange(colours.size, dtype=np.uint8)
        text = b"|".join(bytes(f"{m.shape[0]}x{m.shape[1]}:", "ascii") + rename[m].tobytes() for m in moved)
        best = text if best is None or text < best else best
    return hashlib.blake2b(best, digest_size=16).digest()


def task_keys(pairs: list[gate.Pair]) -> dict[str, list[bytes]]:
    """The keys of one task: each input, each pair, and the task as a whole."""
    pair_keys = [canonical_key((x, y)) for x, y in pairs]
    return {"input": [canonical_key((x,)) for x, _ in pairs], "pair": pair_keys,
            "task": [hashlib.blake2b(b"".join(sorted(pair_keys)), digest_size=16).digest()]}


@dataclass(frozen=True)
class ArcIndex:
    """Key -> the first ARC file that has it, per kind (input, pair, task)."""
    keys: dict[str, dict[bytes, str]]


def load_pairs(path: Path) -> list[gate.Pair]:
    """Every pair of an ARC task file (train then test); a test without an output is skipped."""
    try:
        data = json.loads(path.read_text())
        return [(np.array(p["input"], dtype=np.int8), np.array(p["output"], dtype=np.int8))
                for p in data["train"] + data["test"] if "output" in p]
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"{path}: not an ARC task ({err})") from None


def _file_keys(job: tuple[list[Path], Path]) -> list[tuple[str, dict[str, list[bytes]]]]:
    files, root = job
    return [(str(path.relative_to(root)), task_keys(load_pairs(path))) for path in files]


def index_arc(files: list[Path], root: Path, pool=None) -> ArcIndex:
    keys: dict[str, dict[bytes, str]] = {"input": {}, "pair": {}, "task": {}}
    pool = pool or cluster.Serial()
    shards = [(files[i:i + SHARD], root) for i in range(0, len(files), SHARD)]
    for found in track(pool.map(_file_keys, shards), total=len(shards), description="indexing ARC data"):
        for name, kinds in found:
            for kind, found_keys in kinds.items():
                for key in found_keys:
                    keys[kind].setdefault(key, name)
    return ArcIndex(keys)


@dataclass(frozen=True)
class Finding:
    task: str
    kind: str  # split | replay | gate | input | pair | task
    detail: str


def leaks(name: str, keys: dict[str, list[bytes]], index: ArcIndex) -> list[Finding]:
    found = []
    for kind, found_keys in keys.items():
        for slot, key in enumerate(found_keys):
            if key in index.keys[kind]:
                found.append(Finding(name, kind, f"{kind} {slot} matches {index.keys[kind][key]}"))
    return found


def _raw_rows(programs: list) -> np.ndarray:
    return np.array([admission.raw_behaviour(p, generate.probes()) for p in programs]).reshape(len(programs), -1)


def _replay(jobs: list[tuple]) -> list[tuple[str, list[Finding], dict[str, list[bytes]]]]:
    """One shard of tasks: (name, replay or gate finding, keys) per task, from the task files."""
    out = []
    for name, path, program, rivals in jobs:
        pairs = load_pairs(path)
        found = []
        if any(not np.array_equal(_run(program, x), y) for x, y in pairs):
            found.append(Finding(name, "replay", "the oracle does not reproduce every pair"))
        else:
            report = gate.judge_task(program, pairs, generate.probes(), rivals)
            if not report.accepted:
                found.append(Finding(name, "gate", f"{report.reason}: {report.detail}"))
        out.append((name, found, task_keys(pairs)))
    return out


def audit(corpus: Path, arc_data: Path, pool=None) -> list[Finding]:
    """Every finding in the corpus folder (an empty list means it passed); `pool` runs the shards (default: this
    process)."""
    pool = pool or cluster.Serial()
    rows = [json.loads(line) for line in (corpus / "manifest.jsonl").read_text().splitlines()]
    programs = {row["rule_id"]: rules.from_dict(row["rule"], f"{corpus}/manifest.jsonl: {row['task']}") for row in rows}
    ids = sorted(programs)
    ordered = [programs[i] for i in ids]
    raw = list(pool.map(_raw_rows, [ordered[i:i + SHARD] for i in range(0, len(ids), SHARD)]))
    adm = admission.Admitter.restored(ids, np.concatenate(raw) if raw else
                                      np.empty((0, len(generate.probes())), dtype=np.int64))
    position = {rid: i for i, rid in enumerate(ids)}
    related = compose.kin(ordered)
    index = index_arc(sorted(arc_data.rglob("*.json")), arc_data, pool)
    splits: dict[str, set[str]] = {}
    for row in rows:
        splits.setdefault(row["rule_id"], set()).add(row["split"])
    findings = [Finding(rid, "split", f"tasks in {sorted(found)}: a held-out rule must stay apart")
                for rid, found in sorted(splits.items()) if len(found) > 1]

    def shards():
        """The tasks' jobs, SHARD at a time (rivals chosen as the shards are sent, not all held at once)."""
        for start in range(0, len(rows), SHARD):
            jobs = []
            for row in rows[start:start + SHARD]:
                at = position[row["rule_id"]]
                jobs.append((row["task"], corpus / SPLIT_DIRS[row["split"]] / f"{row['task']}.json",
                             programs[row["rule_id"]], rivals_of(adm.nearest(at, NEAREST), related[at], programs,
                                                                 ordered)))
            yield jobs

    for shard in track(pool.map(_replay, shards()), total=-(-len(rows) // SHARD), description="auditing"):
        for name, found, keys in shard:
            findings.extend(found)
            findings.extend(leaks(name, keys, index))
    return findings


def _run(program, x: np.ndarray) -> np.ndarray | None:
    try:
        return rules.run(program, x)
    except oracle.OracleError:
        return None
