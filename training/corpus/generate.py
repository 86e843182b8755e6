"""Export: admitted rules -> gated tasks in ARC JSON, with a manifest (the shell around admission and the gate).

`python -m training.corpus generate --families F1,F2 --rules N --depth D --tasks-per-rule K --seed S --out DIR
[--workers 2]` admits up to N rules at each depth 1..D (depth 1: single rules of the families, taken in turn from a
seeded order of each; depth d > 1: SEQUENTIAL, SELECT and PARALLEL composites of an admitted depth d-1 rule and an
admitted single rule, in a seeded order), then gates K tasks per rule. It writes
  DIR/tasks/<rule id>-<k>.json   ARC format: five "train" pairs and one "test" pair;
  DIR/heldout/<rule id>-<k>.json the same for held-out rules (5% of each family's admitted rules), kept apart;
  DIR/manifest.jsonl             one row per task: task, split, rule id, family, depth, rule JSON, gate report, seed;
  DIR/gate.json                  admission funnel and gate verdicts, per depth;
  DIR/corpus.png                 the same as bars;
  DIR/progress/                  the checkpoints a restarted run continues from (same arguments, same folder).
A rule gets up to `tries` proposals per task; the gate's rivals are the nearest 8 admitted rules (raw behaviour
distance) and its kin, the composites it is part of and the rules it is made of (`compose.kin`), at any distance. Each task's random stream is derived from (seed, rule id, k), and workers only measure (behaviours, gates)
while the main process judges in a fixed order, so the same seed gives byte-identical files with any number of
workers, killed and restarted or not.
"""

from __future__ import annotations

import hashlib
import json
import multiprocessing
from collections import Counter
from pathlib import Path

import numpy as np
from rich.progress import Progress

from training.corpus import admission, compose, dsl, gate, rules as rulebook

NEAREST = 8
HELD_OUT = 0.05
SPLIT_DIRS = {"train": "tasks", "heldout": "heldout"}
CANDIDATES_PER_RULE = 30  # a depth's candidate list: at most this many per wanted rule
CHUNK = 16  # candidates measured between two checkpoints


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


# --- workers: measure only (their results are judged in order by the main process) ------------------------------

_PROBES: tuple = ()


def _init() -> None:
    global _PROBES
    _PROBES = rulebook.probe_bank()


def _measure(program):
    """(redundant, behaviours): the expensive half of admission."""
    if admission.redundant_stages(program, _PROBES):
        return True, None
    return False, admission.behaviours(program, _PROBES)


def _gate_rule(job):
    """Gate the tasks of one rule: (list of (k, pairs, report) accepted, verdict counts)."""
    program, rivals, seed, tasks_per_rule, tries = job
    rid, counts, accepted = dsl.rule_id(program), Counter(), []
    for k in range(tasks_per_rule):
        for attempt in range(tries):
            try:
                pairs = gate.make_task(program, task_rng(seed, rid, k, attempt), _PROBES, rivals)
            except ValueError:  # the scene generator found no unambiguous input for this rule
                counts["no_scene"] += 1
                break
            report = gate.judge_task(program, pairs, _PROBES, rivals)
            counts[report.reason] += 1
            if report.accepted:
                accepted.append((k, pairs, report.reason))
                break
    return accepted, counts


# --- checkpoints ------------------------------------------------------------------------------------------------

def _write(path: Path, text: str) -> None:
    """Write whole or not at all (a kill leaves the old checkpoint)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    tmp.replace(path)


def _save_admission(progress: Path, state: dict, adm: admission.Admitter) -> None:
    np.save(progress / "matrix.npy", adm.matrix)
    _write(progress / "admission.json", json.dumps(state, sort_keys=True))


def generate(rules: int, tasks_per_rule: int, seed: int, out: Path, tries: int = 3, programs: list | None = None,
             families: list[str] | None = None, depth: int = 1, workers: int = 1) -> Counter:
    """Admit and gate as the module docstring says; `programs` replaces the depth-1 candidates. Returns the gate's
    verdicts counted by reason (plus no_scene), all depths together."""
    families = list(families or rulebook.FAMILIES)
    progress = out / "progress"
    (progress / "gated").mkdir(parents=True, exist_ok=True)
    for folder in SPLIT_DIRS.values():
        (out / folder).mkdir(parents=True, exist_ok=True)
    args = {"rules": rules, "tasks_per_rule": tasks_per_rule, "seed": seed, "tries": tries, "families": families,
            "depth": depth, "programs": None if programs is None else [dsl.canonical_json(p) for p in programs]}
    if (progress / "args.json").exists() and json.loads((progress / "args.json").read_text()) != args:
        raise SystemExit(f"{out}: holds a run with other arguments ({progress / 'args.json'}); use a new --out")
    _write(progress / "args.json", json.dumps(args, sort_keys=True))
    probes = rulebook.probe_bank()
    _init()
    ctx = multiprocessing.get_context("fork")
    pool = ctx.Pool(workers, initializer=_init) if workers > 1 else None
    mapper = pool.imap if pool else map
    try:
        with Progress() as bar:
            admitted, adm, funnels = _admit(rules, seed, depth, families, programs, probes, progress, mapper, bar)
            records = _gate(admitted, adm, seed, tasks_per_rule, tries, out, mapper, bar)
    finally:
        if pool:
            pool.close()
            pool.join()
    verdicts: dict[int, Counter] = {}
    manifest = []
    for program, record in zip(admitted, records):
        verdicts.setdefault(compose.depth(program), Counter()).update(record["counts"])
        manifest.extend(record["manifest"])
    (out / "manifest.jsonl").write_text("".join(json.dumps(m, sort_keys=True) + "\n" for m in manifest))
    total = sum(verdicts.values(), Counter())
    report = {"seed": seed, "rules": len(admitted), "verdicts": dict(sorted(total.items())),
              "by_depth": {str(d): {"admission": funnels[d], "gate": dict(sorted(verdicts.get(d, {}).items()))}
                           for d in sorted(funnels)}}
    (out / "gate.json").write_text(json.dumps(report, indent=2) + "\n")
    plot(report, out / "corpus.png")
    return total


def _admit(rules, seed, depth, families, programs, probes, progress, mapper, bar):
    """Admission, depth by depth, from the checkpoint if there is one."""
    state = {"depth": 1, "position": 0, "funnels": {}, "admitted": []}
    if (progress / "admission.json").exists():
        state = json.loads((progress / "admission.json").read_text())
    admitted = [rulebook.from_dict(r, f"{progress}/admission.json") for r in state["admitted"]]
    adm = admission.Admitter.restored([dsl.rule_id(p) for p in admitted],
                                      np.load(progress / "matrix.npy") if admitted else
                                      np.empty((0, len(probes)), dtype=np.int64))
    leaves = programs if programs is not None else leaf_candidates(families, seed)
    task = bar.add_task("admitting", total=rules * depth, completed=len(admitted))
    while state["depth"] <= depth:
        d = state["depth"]
        if d == 1:
            candidates = leaves
        else:
            lower = [p for p in admitted if compose.depth(p) == d - 1]
            singles = [p for p in admitted if compose.depth(p) == 1]
            candidates = composite_candidates(lower, singles, CANDIDATES_PER_RULE * rules, seed, d) if lower else []
        funnel = Counter(state["funnels"].get(str(d), {}))
        have = sum(compose.depth(p) == d for p in admitted)
        while have < rules and state["position"] < len(candidates):
            chunk = candidates[state["position"]:state["position"] + CHUNK]
            for program, (redundant, conj) in zip(chunk, mapper(_measure, chunk)):
                state["position"] += 1
                if have == rules:
                    continue  # measured in the chunk, but the depth is full: not judged, as in a one-by-one run
                if redundant:
                    funnel["redundant_stage"] += 1
                    continue
                verdict = adm.consider(dsl.rule_id(program), conj)
                funnel[verdict.reason] += 1
                if verdict.reason == "admitted":
                    admitted.append(program)
                    state["admitted"].append(program.to_dict())
                    have += 1
                    bar.advance(task)
            state["funnels"][str(d)] = dict(sorted(funnel.items()))
            _save_admission(progress, state, adm)
        state["funnels"][str(d)] = dict(sorted(funnel.items()))
        state["depth"], state["position"] = d + 1, 0
        _save_admission(progress, state, adm)
    return admitted, adm, {int(d): f for d, f in state["funnels"].items()}


def rivals(nearest: list[str], related: list[int], by_id: dict, programs: list) -> list:
    """The gate's rivals of a rule: its nearest admitted rules by behaviour (ids), then its kin (positions in
    `programs`, `compose.kin`) not already among them. Pure."""
    found = [by_id[r] for r in nearest]
    return found + [programs[j] for j in related if programs[j] not in found]


def _gate(admitted, adm, seed, tasks_per_rule, tries, out, mapper, bar) -> list[dict]:
    """Gate every rule without a record yet; a rule's record is written after its task files (the commit mark)."""
    by_id = {dsl.rule_id(p): p for p in admitted}
    kept_apart = held_out(admitted)
    records: dict[int, dict] = {}
    todo = []
    for row, program in enumerate(admitted):
        path = out / "progress" / "gated" / f"{dsl.rule_id(program)}.json"
        if path.exists():
            records[row] = json.loads(path.read_text())
        else:
            todo.append(row)
    task = bar.add_task("gating", total=len(admitted), completed=len(records))
    related = compose.kin(admitted)  # components and the composites holding them: rivals at any distance
    jobs = ((admitted[row], rivals(adm.nearest(row, NEAREST), related[row], by_id, admitted), seed, tasks_per_rule,
             tries) for row in todo)
    for row, (accepted, counts) in zip(todo, mapper(_gate_rule, jobs)):
        program = admitted[row]
        rid = dsl.rule_id(program)
        split = "heldout" if rid in kept_apart else "train"
        manifest = []
        for k, pairs, reason in accepted:
            name = f"{rid}-{k}"
            (out / SPLIT_DIRS[split] / f"{name}.json").write_text(json.dumps(task_json(pairs)) + "\n")
            manifest.append({"task": name, "split": split, "rule_id": rid, "family": program.family,
                             "depth": compose.depth(program), "rule": program.to_dict(), "gate": reason,
                             "seed": seed})
        records[row] = {"manifest": manifest, "counts": dict(sorted(counts.items()))}
        _write(out / "progress" / "gated" / f"{rid}.json", json.dumps(records[row], sort_keys=True))
        bar.advance(task)
    return [records[row] for row in range(len(admitted))]


def plot(report: dict, path: Path) -> None:
    """Admission funnel and gate verdicts per depth, as grouped bars."""
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
    fig.savefig(path, dpi=100, metadata={"Software": None})  # no version stamp: same seed, same bytes
    plt.close(fig)
