"""python -m training.corpus admit --families select_mask_render,count_pack,symmetry_repair,rays --candidates 50 \
    --seed 0 --out runs/corpus-admit
python -m training.corpus generate --families select_mask_render,count_pack,symmetry_repair,rays --rules 20 \
    --depth 2 --tasks-per-rule 2 --seed 0 --workers 2 [--address ADDR] --out runs/corpus
python -m training.corpus audit runs/corpus [--arc-data ../shared/arc-data] [--workers 2] [--address ADDR]

`admit`: admission of up to `--candidates` sampled single rules per family (a family with fewer rules gives all of
them, in a seeded order), the families interleaved one by one as generate's depth 1 takes them, all judged by one
admitter on `rules.probe_bank()` (each family's typed inputs). Writes `rules.jsonl` (one admitted rule per line, id,
family and canonical JSON, in admission order), `funnel.json` and `funnel.png` (candidates per verdict, by family),
and prints the funnel table by family.
`generate`: gated ARC tasks and a manifest (training/corpus/generate.py). Same seed, same bytes; a killed run started
again with the same arguments continues from its last complete shard; the same folder with other arguments (a new
seed, more rules) grows the corpus once its last run is finished.
`audit`: replays every gate and looks for leaks of public ARC data (training/corpus/audit.py); exit 1 on a finding.
Both run their measurements as Ray tasks (training/corpus/cluster.py): a local Ray on `--workers` CPUs that the
command starts and stops, or the cluster at `--address` (`ray start --head` on one machine, `ray start --address`
on the others); `--workers 0` runs in this process without Ray. Exit 2 for a folder or setting that cannot be used.
`probe`: the transfer probe, held-out corpus tasks and a real panel through the solver side by side
(`python -m training.corpus probe --corpus DIR --real TASKS --out OUT ...`, training/corpus/probe.py, also
`python -m training.corpus.probe`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path

import numpy as np
from rich.progress import track

from training.corpus import admission, audit, cluster, dsl, generate, rules
from training.corpus.store import CorpusError

DEFAULT_ARC_DATA = Path(os.environ.get("ARC_DATA", Path(__file__).resolve().parents[3] / "shared" / "arc-data"))


def funnel_table(by_family: dict[str, dict[str, int]]) -> str:
    """The funnel as a Markdown table: one column per family and a total, verdicts in admission's order.

    >>> print(funnel_table({"rays": {"admitted": 3, "near_raw": 1}, "count_pack": {"admitted": 2}}))
    | verdict | rays | count_pack | total |
    | --- | --- | --- | --- |
    | admitted | 3 | 2 | 5 |
    | redundant_stage | 0 | 0 | 0 |
    | too_few_valid | 0 | 0 | 0 |
    | duplicate_raw | 0 | 0 | 0 |
    | duplicate_dihedral | 0 | 0 | 0 |
    | near_raw | 1 | 0 | 1 |
    | near_dihedral | 0 | 0 | 0 |
    | candidates | 4 | 2 | 6 |
    """
    columns = [[funnel.get(reason, 0) for reason in admission.REASONS] for funnel in by_family.values()]
    totals = [sum(row) for row in zip(*columns)]
    lines = [f"| verdict | {' | '.join(by_family)} | total |", "| --- |" + " --- |" * (len(by_family) + 1)]
    for reason, *counts in zip(admission.REASONS, *columns, totals):
        lines.append(f"| {reason} | {' | '.join(map(str, counts))} |")
    sums = [sum(column) for column in columns]
    lines.append(f"| candidates | {' | '.join(map(str, sums + [sum(sums)]))} |")
    return "\n".join(lines)


def plot_funnel(by_family: dict[str, dict[str, int]], path: Path) -> None:
    """Candidates per verdict as grouped bars, one colour per family."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.5))
    width = 0.8 / max(len(by_family), 1)
    for i, (family, funnel) in enumerate(by_family.items()):
        ax.barh(np.arange(len(admission.REASONS)) + i * width, [funnel.get(r, 0) for r in admission.REASONS],
                height=width, label=family)
    ax.set_yticks(np.arange(len(admission.REASONS)) + 0.4 - width / 2, admission.REASONS)
    ax.invert_yaxis()
    ax.set_xlabel("candidates")
    ax.set_title(f"admission funnel ({sum(sum(f.values()) for f in by_family.values())} candidates)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})  # no version stamp: same seed, same bytes
    plt.close(fig)


def sampled(families: list[str], per_family: int, seed: int) -> list:
    """Up to `per_family` single rules of each family, in generate's seeded order (families interleaved one by one).

    >>> [p.family for p in sampled(["rays", "count_pack"], 2, 0)]
    ['rays', 'count_pack', 'rays', 'count_pack']
    """
    taken: Counter = Counter()
    out = []
    for program in generate.leaf_candidates(families, seed):
        if taken[program.family] < per_family:
            taken[program.family] += 1
            out.append(program)
    return out


def admit(candidates: int, seed: int, out: Path, families: list[str] | None = None) -> dict[str, dict[str, int]]:
    """Admit the sampled rules of `families` (default: all) against one bank and one admitter; returns the funnel
    by family, every verdict present (0 when none)."""
    families = list(families or rules.FAMILIES)
    if candidates < 1:
        raise CorpusError(f"--candidates: must be >= 1, got {candidates}")
    probes = rules.probe_bank()
    adm = admission.Admitter(len(probes))
    by_family = {family: Counter() for family in families}
    admitted = []
    for program in track(sampled(families, candidates, seed), description="admitting"):
        reason = admission.admit_program(adm, program, probes).reason
        by_family[program.family][reason] += 1
        if reason == "admitted":
            admitted.append(program)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rules.jsonl").write_text("".join(json.dumps(
        {"id": dsl.rule_id(p), "family": p.family, "rule": p.to_dict()}, sort_keys=True) + "\n" for p in admitted))
    funnels = {family: {reason: counts[reason] for reason in admission.REASONS} for family, counts in by_family.items()}
    (out / "funnel.json").write_text(json.dumps({"seed": seed, "candidates_per_family": candidates,
                                                 "by_family": funnels}, indent=2) + "\n")
    plot_funnel(funnels, out / "funnel.png")
    return funnels


def parse_families(text: str, parser: argparse.ArgumentParser) -> list[str]:
    families = text.split(",")
    unknown = sorted(set(families) - set(rules.FAMILIES))
    if unknown:
        parser.error(f"--families: {unknown} not available (have {list(rules.FAMILIES)})")
    if len(set(families)) < len(families):
        parser.error(f"--families: {text!r} names a family twice")
    return families


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["probe"]:  # the transfer probe has its own options (training/corpus/probe.py)
        from training.corpus import probe

        raise SystemExit(probe.main(argv[1:], prog="python -m training.corpus probe"))
    parser = argparse.ArgumentParser(prog="python -m training.corpus", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("probe", help="held-out corpus tasks and a real panel through the solver, side by side "
                                 "(options: python -m training.corpus probe --help)")
    p_admit = sub.add_parser("admit", help="run admission over sampled single rules of each family")
    p_admit.add_argument("--families", default=",".join(rules.FAMILIES),
                         help=f"comma-separated; available: {', '.join(rules.FAMILIES)}")
    p_admit.add_argument("--candidates", type=int, default=50,
                         help="rules sampled per family (a smaller family gives all of its rules)")
    p_admit.add_argument("--seed", type=int, default=0)
    p_admit.add_argument("--out", type=Path, required=True)
    p_gen = sub.add_parser("generate", help="admit rules and write gated ARC tasks with a manifest")
    p_gen.add_argument("--families", default=",".join(rules.FAMILIES),
                       help=f"comma-separated; available: {', '.join(rules.FAMILIES)}")
    p_gen.add_argument("--rules", type=int, default=20, help="rules admitted at each depth")
    p_gen.add_argument("--depth", type=int, default=1, help="composites of up to this many rules (1: none)")
    p_gen.add_argument("--tries", type=int, default=3, help="task proposals per task")
    add_cluster_arguments(p_gen)
    p_gen.add_argument("--tasks-per-rule", type=int, default=2)
    p_gen.add_argument("--seed", type=int, default=0)
    p_gen.add_argument("--out", type=Path, required=True)
    p_audit = sub.add_parser("audit", help="replay every gate and check for leaks of public ARC data")
    p_audit.add_argument("corpus", type=Path)
    p_audit.add_argument("--arc-data", type=Path, default=DEFAULT_ARC_DATA,
                         help="folder of ARC task JSON files, searched recursively (default: $ARC_DATA or "
                              "../shared/arc-data)")
    add_cluster_arguments(p_audit)
    args = parser.parse_args(argv)
    try:
        run(args, parser)
    except CorpusError as err:
        print(f"error: {err}", file=sys.stderr)
        raise SystemExit(2) from None


def add_cluster_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1),
                        help="CPUs of the local Ray this command starts (0: this process, without Ray)")
    parser.add_argument("--address", help="a Ray cluster's address (ray start --head prints it) instead of a local Ray")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """One command; a CorpusError from it is the caller's exit 2."""
    if args.command in ("generate", "audit") and args.workers < 0:
        parser.error("--workers must be >= 0")
    if args.command == "audit":
        if not args.arc_data.is_dir():
            parser.error(f"--arc-data: {args.arc_data} is not a folder")
        pool = cluster.pool(args.workers, args.address)
        try:
            findings = audit.audit(args.corpus, args.arc_data, pool)
        finally:
            pool.close()
        for f in findings:
            print(f"{f.task}: {f.kind}: {f.detail}")
        print(f"{len(findings)} findings")
        raise SystemExit(1 if findings else 0)
    families = parse_families(args.families, parser)
    if args.command == "admit":
        print(funnel_table(admit(args.candidates, args.seed, args.out, families)))
        print(f"wrote {args.out}/rules.jsonl, {args.out}/funnel.json and {args.out}/funnel.png")
        return
    if args.depth < 1 or args.rules < 1:
        parser.error("--depth and --rules must be >= 1")
    pool = cluster.pool(args.workers, args.address)
    try:
        generate.generate(args.rules, args.tasks_per_rule, args.seed, args.out, tries=args.tries,
                          families=families, depth=args.depth, pool=pool)
    finally:
        pool.close()
    print(depth_table(json.loads((args.out / "gate.json").read_text())))
    print(f"wrote {args.out}/gate.json and {args.out}/corpus.png")


def depth_table(report: dict) -> str:
    """Admission and gate rates per depth, from gate.json.

    >>> print(depth_table({"by_depth": {"1": {"admission": {"admitted": 3, "near_raw": 1},
    ...                                       "gate": {"accepted": 2, "shortcut": 2}}}}))
    | depth | candidates | admitted | admission rate | task attempts | accepted | gate rate | rejections |
    | --- | --- | --- | --- | --- | --- | --- | --- |
    | 1 | 4 | 3 | 75% | 4 | 2 | 50% | shortcut 2 |
    """
    rows = ["| depth | candidates | admitted | admission rate | task attempts | accepted | gate rate | rejections |",
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for depth, part in sorted(report["by_depth"].items()):
        cands, adm = sum(part["admission"].values()), part["admission"].get("admitted", 0)
        tries, acc = sum(part["gate"].values()), part["gate"].get("accepted", 0)
        rejected = ", ".join(f"{k} {v}" for k, v in sorted(part["gate"].items()) if k != "accepted")
        rows.append(f"| {depth} | {cands} | {adm} | {adm / max(cands, 1):.0%} | {tries} | {acc} | "
                    f"{acc / max(tries, 1):.0%} | {rejected} |")
    return "\n".join(rows)


if __name__ == "__main__":
    main()
