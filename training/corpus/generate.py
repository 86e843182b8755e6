"""Export: admitted rules -> gated tasks in ARC JSON, with a manifest (the shell around admission and the gate).

`python -m training.corpus generate --families F1,F2 --rules N --depth D --tasks-per-rule K --seed S --out DIR
[--workers 2] [--address ADDR]` admits up to N rules at each depth 1..D (depth 1: single rules of the families, taken
in turn from a seeded order of each; depth d > 1: SEQUENTIAL, SELECT and PARALLEL composites of an admitted depth d-1
rule and an admitted single rule, in a seeded order), then gates K tasks per rule. It writes
  DIR/tasks/<rule id>-<k>.json   ARC format: five "train" pairs and one "test" pair;
  DIR/heldout/<rule id>-<k>.json the same for held-out rules (5% of each family's rules admitted by a run), apart;
  DIR/manifest.jsonl             one row per task: task, split, rule id, family, depth, rule JSON, gate report, seed;
  DIR/gate.json                  admission funnel and gate verdicts, per depth;
  DIR/corpus.png                 the same as bars;
  DIR/progress/                  the ledger (below).
A rule gets up to `tries` proposals per task; the gate's rivals are the nearest 8 admitted rules within
admission.RIVAL_RADIUS (raw behaviour distance, from the block index) and its kin, the composites it is part of and
the rules it is made of (`compose.kin`), at any distance. Each task's random stream is derived from (seed, rule id,
k); the measurements (behaviours, gates) run as Ray tasks or in this process (cluster.py) and come back in order,
and this process judges them in that order, so the same seed gives byte-identical files with any number of workers,
killed and restarted or not.

The ledger is append-only (issue 32), every file written whole or not at all (store.py):
  progress/segments/NNN.json     the arguments of each run that grew the folder;
  progress/admit/NNNNNN.npy      an admission shard: the behaviour rows of the rules it admitted, then
  progress/admit/NNNNNN.json     its entry (run, depth, candidate position, funnel, rules), the commit mark;
  progress/gated/<rule id>.json  a gated rule's manifest rows and verdicts, written after its task files.
A restart reads the committed shards and continues after the last; nothing committed is written again. The same
folder with other arguments (a new seed, more rules, other families) is a new run that grows the corpus: its
candidates skip the rules admitted before, are judged against all of them, and its tasks are appended; it is
refused (CorpusError) until the last run is finished. manifest.jsonl, gate.json and corpus.png are derived from the
ledger at the end of every run.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections import Counter
from pathlib import Path

import numpy as np
from rich.progress import Progress

from training.corpus import admission, cluster, compose, dsl, gate, rules as rulebook, store

NEAREST = 8
HELD_OUT = 0.05
SPLIT_DIRS = {"train": "tasks", "heldout": "heldout"}
CANDIDATES_PER_RULE = 30  # a depth's candidate list: at most this many per wanted rule
CHUNK = 16  # candidates judged per admission shard


def held_out(rules: list, fraction: float = HELD_OUT) -> set[str]:
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


def leaf_candidates(families: list[str], seed: int) -> list:
    """Each family's single rules in a seeded order, interleaved one by one (a small family runs out first)."""
    orders = []
    for n, family in enumerate(families):
        programs = rulebook.all_programs(family)
        orders.append([programs[int(i)] for i in np.random.default_rng([seed, n]).permutation(len(programs))])
    return [order[i] for i in range(max(map(len, orders))) for order in orders if i < len(order)]


def composite_candidates(lower: list, leaves: list, count: int, seed: int, depth: int) -> list:
    """Up to `count` well-typed composites (SEQUENTIAL, SELECT, PARALLEL) of a lower rule and a single rule, in a
    seeded order.

    >>> from training.corpus.family_rays import Rays
    >>> a, b = Rays("right", "wall", "mark"), Rays("up", "wall", "mark")
    >>> sorted({c.family for c in composite_candidates([a, b], [a, b], 12, 0, 2)})
    ['parallel', 'select', 'sequential']
    """
    rng, out, seen = np.random.default_rng([seed, depth, 7]), [], set()
    for _ in range(count * 4):
        if len(out) == count:
            break
        x, y = lower[int(rng.integers(len(lower)))], leaves[int(rng.integers(len(leaves)))]
        if rng.random() < 0.5:
            x, y = y, x
        kind = int(rng.integers(3))
        try:
            if kind == 0:
                made = compose.Sequential(x, y)
            elif kind == 1:
                made = compose.Select(compose.PREDICATES[int(rng.integers(len(compose.PREDICATES)))], x, y)
            else:
                made = compose.Parallel(x, y, compose.JOINS[int(rng.integers(len(compose.JOINS)))])
        except dsl.ProgramError:
            continue
        if made not in seen:
            seen.add(made)
            out.append(made)
    return out


# --- measurements: Ray tasks or this process (cluster.py); their results are judged in order by generate ---------

_PROBES: tuple = ()


def probes() -> tuple[np.ndarray, ...]:
    """Admission's bank, built once per process (a Ray worker builds it on its first task)."""
    global _PROBES
    if not _PROBES:
        _PROBES = rulebook.probe_bank()
    return _PROBES


def _measure(program):
    """(redundant, behaviours): the expensive half of admission."""
    if admission.redundant_stages(program, probes()):
        return True, None
    return False, admission.behaviours(program, probes())


def _gate_rule(job):
    """Gate the tasks of one rule: (list of (k, pairs, report) accepted, verdict counts)."""
    program, rivals, seed, tasks_per_rule, tries = job
    rid, counts, accepted = dsl.rule_id(program), Counter(), []
    for k in range(tasks_per_rule):
        for attempt in range(tries):
            try:
                pairs = gate.make_task(program, task_rng(seed, rid, k, attempt), probes(), rivals)
            except ValueError:  # the scene generator found no unambiguous input for this rule
                counts["no_scene"] += 1
                break
            report = gate.judge_task(program, pairs, probes(), rivals)
            counts[report.reason] += 1
            if report.accepted:
                accepted.append((k, pairs, report.reason))
                break
    return accepted, counts


# --- the ledger: runs (segments), admission shards, gated rules; append-only (store.py) ----------------------------

def _segments(progress: Path) -> list[dict]:
    """The arguments of every run that grew this corpus, in order."""
    out = []
    while (path := progress / "segments" / f"{len(out):03d}.json").exists():
        out.append(json.loads(path.read_text()))
    return out


def _shards(progress: Path, n_slots: int) -> tuple[list[dict], np.ndarray]:
    """The committed admission shards (entries in order) and their behaviour rows, one per admitted rule."""
    entries, rows = [], []
    while (path := progress / "admit" / f"{len(entries):06d}.json").exists():
        entry = json.loads(path.read_text())
        shard = np.load(path.with_suffix(".npy"))
        if shard.shape != (len(entry["rules"]), n_slots):
            raise store.CorpusError(f"{path}: field 'rules': {len(entry['rules'])} rules, but its .npy holds rows of "
                                    f"shape {shard.shape} ({n_slots} probe slots expected)")
        entries.append(entry)
        rows.append(shard)
    return entries, np.concatenate(rows) if rows else np.empty((0, n_slots), dtype=np.int64)


def _commit_shard(progress: Path, number: int, entry: dict, rows: np.ndarray) -> None:
    """The rows first, then the entry that makes them count (a kill between the two leaves the shard uncommitted)."""
    data = io.BytesIO()
    np.save(data, rows)
    store.write(progress / "admit" / f"{number:06d}.npy", data.getvalue(), "rows")
    store.write(progress / "admit" / f"{number:06d}.json", json.dumps(entry, sort_keys=True).encode(), "entry")


def _finished(segment: int, args: dict, entries: list[dict], progress: Path) -> bool:
    """Whether a run's admission reached its last depth and each rule it admitted was gated."""
    mine = [e for e in entries if e["segment"] == segment]
    if not mine or not (mine[-1]["done"] and mine[-1]["depth"] == args["depth"]):
        return False
    return all((progress / "gated" / f"{dsl.rule_id(rulebook.from_dict(r))}.json").exists()
               for e in mine for r in e["rules"])


def generate(rules: int, tasks_per_rule: int, seed: int, out: Path, tries: int = 3, programs: list | None = None,
             families: list[str] | None = None, depth: int = 1, pool=None) -> Counter:
    """Admit and gate as the module docstring says; `programs` replaces the depth-1 candidates; `pool` runs the
    measurements (cluster.py; default: this process). Returns the gate's verdicts counted by reason (plus
    no_scene), all depths and runs together. Raises CorpusError when the folder's last run is unfinished and these
    arguments differ from it."""
    families = list(families or rulebook.FAMILIES)
    pool = pool or cluster.Serial()
    progress = out / "progress"
    if (progress / "admission.json").exists():
        raise store.CorpusError(f"{out}: written by an older generate ({progress / 'admission.json'}: one checkpoint "
                                "rewritten whole, not this ledger); give a new --out")
    for folder in ("segments", "admit", "gated"):
        (progress / folder).mkdir(parents=True, exist_ok=True)
    for folder in SPLIT_DIRS.values():
        (out / folder).mkdir(parents=True, exist_ok=True)
    args = {"rules": rules, "tasks_per_rule": tasks_per_rule, "seed": seed, "tries": tries, "families": families,
            "depth": depth, "programs": None if programs is None else [dsl.canonical_json(p) for p in programs]}
    segments = _segments(progress)
    entries, rows = _shards(progress, len(probes()))
    if args not in segments:
        if segments and not _finished(len(segments) - 1, segments[-1], entries, progress):
            raise store.CorpusError(
                f"{out}: its last run ({progress / 'segments' / f'{len(segments) - 1:03d}.json'}) is unfinished; "
                "run it again with the same arguments to finish it, then grow the corpus with these")
        store.write(progress / "segments" / f"{len(segments):03d}.json", json.dumps(args, sort_keys=True).encode(),
                    "segment")
        segments.append(args)
    admitted = [rulebook.from_dict(r, f"{progress}/admit: segment {e['segment']}") for e in entries for r in e["rules"]]
    adm = admission.Admitter.restored([dsl.rule_id(p) for p in admitted], rows)
    with Progress() as bar:
        for segment, run in enumerate(segments):
            _admit(segment, run, entries, admitted, adm, progress, pool, bar)
            _gate(segment, run, entries, admitted, adm, out, pool, bar)
    return _write_outputs(segments, entries, admitted, out)


def _candidates(segment: int, run: dict, d: int, entries: list[dict], admitted: list) -> list:
    """A run's candidates at depth d, in their seeded order, without the rules that earlier runs admitted."""
    if d == 1:
        found = ([rulebook.from_dict(json.loads(p), "segment programs") for p in run["programs"]]
                 if run["programs"] is not None else leaf_candidates(run["families"], run["seed"]))
    else:
        rules_at = _rules_by_depth(entries, admitted, segment)
        found = (composite_candidates(rules_at.get(d - 1, []), rules_at.get(1, []),
                                      CANDIDATES_PER_RULE * run["rules"], run["seed"], d)
                 if rules_at.get(d - 1) else [])
    before = {dsl.rule_id(p) for e, p in _owners(entries, admitted) if e["segment"] < segment}
    return [p for p in found if dsl.rule_id(p) not in before]


def _owners(entries: list[dict], admitted: list):
    """(entry, program) for every admitted rule, in admission order."""
    programs = iter(admitted)
    return [(e, next(programs)) for e in entries for _ in e["rules"]]


def _rules_by_depth(entries: list[dict], admitted: list, last_segment: int) -> dict[int, list]:
    out: dict[int, list] = {}
    for entry, program in _owners(entries, admitted):
        if entry["segment"] <= last_segment:
            out.setdefault(entry["depth"], []).append(program)
    return out


def _admit(segment, run, entries, admitted, adm, progress, pool, bar) -> None:
    """Admission of one run, depth by depth, from its last committed shard; a shard every CHUNK candidates."""
    mine = [e for e in entries if e["segment"] == segment]
    d, position = 1, 0
    if mine:
        d, position = (mine[-1]["depth"] + 1, 0) if mine[-1]["done"] else (mine[-1]["depth"], mine[-1]["position"])
    task = bar.add_task(f"admitting (run {segment})", total=run["rules"] * run["depth"],
                        completed=sum(len(e["rules"]) for e in mine))
    while d <= run["depth"]:
        candidates = _candidates(segment, run, d, entries, admitted)
        have = sum(len(e["rules"]) for e in mine if e["depth"] == d)
        funnel, new = Counter(), []
        measured = pool.map(_measure, candidates[position:]) if have < run["rules"] else iter(())
        for program, (redundant, conj) in zip(candidates[position:], measured):
            position += 1
            if redundant:
                funnel["redundant_stage"] += 1
            else:
                verdict = adm.consider(dsl.rule_id(program), conj)
                funnel[verdict.reason] += 1
                if verdict.reason == "admitted":
                    new.append(program)
                    bar.advance(task)
            full = have + len(new) == run["rules"]
            if full or sum(funnel.values()) == CHUNK:
                _append(progress, entries, admitted, new, adm,
                        {"segment": segment, "depth": d, "position": position, "done": False, "funnel": funnel})
                mine.append(entries[-1])
                have, funnel, new = have + len(new), Counter(), []
                if full:
                    break
        if funnel:
            _append(progress, entries, admitted, new, adm,
                    {"segment": segment, "depth": d, "position": position, "done": False, "funnel": funnel})
            mine.append(entries[-1])
        _append(progress, entries, admitted, [], adm,
                {"segment": segment, "depth": d, "position": position, "done": True, "funnel": {}})
        mine.append(entries[-1])
        d, position = d + 1, 0


def _append(progress, entries, admitted, new, adm, entry) -> None:
    """Commit one admission shard and add it to the ledger in memory."""
    entry = {**entry, "funnel": dict(sorted(entry["funnel"].items())), "rules": [p.to_dict() for p in new]}
    _commit_shard(progress, len(entries), entry, adm.matrix[len(adm.ids) - len(new):])
    entries.append(entry)
    admitted.extend(new)


def rivals(nearest: list[str], related: list[int], by_id: dict, programs: list) -> list:
    """The gate's rivals of a rule: its nearest admitted rules by behaviour (ids), then its kin (positions in
    `programs`, `compose.kin`) not already among them. Pure."""
    found = [by_id[r] for r in nearest]
    return found + [programs[j] for j in related if programs[j] not in found]


def _gate(segment, run, entries, admitted, adm, out, pool, bar) -> None:
    """Gate every rule of one run without a record yet; a rule's record is written after its task files (the commit
    mark). Rivals come from every rule admitted so far (later runs do not exist before this one is finished)."""
    by_id = {dsl.rule_id(p): p for p in admitted}
    rows = [row for row, (entry, _) in enumerate(_owners(entries, admitted)) if entry["segment"] == segment]
    kept_apart = held_out([admitted[row] for row in rows])
    todo = [row for row in rows if not (out / "progress" / "gated" / f"{dsl.rule_id(admitted[row])}.json").exists()]
    task = bar.add_task(f"gating (run {segment})", total=len(rows), completed=len(rows) - len(todo))
    if not todo:
        return
    related = compose.kin(admitted)  # components and the composites holding them: rivals at any distance
    jobs = ((admitted[row], rivals(adm.nearest(row, NEAREST), related[row], by_id, admitted), run["seed"],
             run["tasks_per_rule"], run["tries"]) for row in todo)
    for row, (accepted, counts) in zip(todo, pool.map(_gate_rule, jobs)):
        program = admitted[row]
        rid = dsl.rule_id(program)
        split = "heldout" if rid in kept_apart else "train"
        manifest = []
        for k, pairs, reason in accepted:
            name = f"{rid}-{k}"
            store.write(out / SPLIT_DIRS[split] / f"{name}.json", (json.dumps(task_json(pairs)) + "\n").encode(),
                        "task")
            manifest.append({"task": name, "split": split, "rule_id": rid, "family": program.family,
                             "depth": compose.depth(program), "rule": program.to_dict(), "gate": reason,
                             "seed": run["seed"]})
        record = {"manifest": manifest, "counts": dict(sorted(counts.items()))}
        store.write(out / "progress" / "gated" / f"{rid}.json", json.dumps(record, sort_keys=True).encode(), "gated")
        bar.advance(task)


def _write_outputs(segments, entries, admitted, out) -> Counter:
    """manifest.jsonl (streamed from the gated records), gate.json and corpus.png, from the ledger alone."""
    verdicts: dict[int, Counter] = {}
    funnels: dict[int, Counter] = {}
    for entry in entries:
        funnels.setdefault(entry["depth"], Counter()).update(entry["funnel"])

    def lines():
        for entry, program in _owners(entries, admitted):
            record = json.loads((out / "progress" / "gated" / f"{dsl.rule_id(program)}.json").read_text())
            verdicts.setdefault(entry["depth"], Counter()).update(record["counts"])
            yield from (json.dumps(m, sort_keys=True) + "\n" for m in record["manifest"])

    store.write_lines(out / "manifest.jsonl", lines(), "manifest")
    total = sum(verdicts.values(), Counter())
    report = {"seed": segments[-1]["seed"], "runs": len(segments), "rules": len(admitted),
              "verdicts": dict(sorted(total.items())),
              "by_depth": {str(d): {"admission": dict(sorted(funnels[d].items())),
                                    "gate": dict(sorted(verdicts.get(d, {}).items()))} for d in sorted(funnels)}}
    store.write(out / "gate.json", (json.dumps(report, indent=2) + "\n").encode(), "report")
    store.write(out / "corpus.png", plot(report), "plot")
    return total


def plot(report: dict) -> bytes:
    """Admission funnel and gate verdicts per depth, as grouped bars: PNG bytes."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 3.5))
    for ax, part, reasons in ((axes[0], "admission", admission.REASONS),
                              (axes[1], "gate", gate.REASONS + ("no_scene",))):
        depths = sorted(report["by_depth"])
        for i, d in enumerate(depths):
            counts = [report["by_depth"][d][part].get(r, 0) for r in reasons]
            ax.barh(np.arange(len(reasons)) + i * 0.8 / len(depths), counts, height=0.8 / len(depths),
                    label=f"depth {d}")
        ax.set_yticks(np.arange(len(reasons)) + 0.4 - 0.4 / max(len(depths), 1), reasons)
        ax.invert_yaxis()
        ax.set_xlabel("candidates" if part == "admission" else "task attempts")
        ax.set_title(f"{part} by depth")
        ax.legend()
    fig.tight_layout()
    data = io.BytesIO()
    fig.savefig(data, format="png", dpi=100, metadata={"Software": None})  # no version stamp: same seed, same bytes
    plt.close(fig)
    return data.getvalue()
