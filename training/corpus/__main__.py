"""python -m training.corpus admit --candidates 300 --seed 0 --out runs/corpus-admit
python -m training.corpus generate --families select_mask_render,count_pack,symmetry_repair,rays --rules 20 \
    --depth 2 --tasks-per-rule 2 --seed 0 --workers 2 --out runs/corpus
python -m training.corpus audit runs/corpus [--arc-data ../shared/arc-data]

`admit`: admission over sampled select-mask-render programs on that family's bank; writes `rules.jsonl` (one
admitted rule per line, id and canonical JSON, in admission order), `funnel.json` and `funnel.png` (candidates per
verdict), and prints the funnel.
`generate`: gated ARC tasks and a manifest (training/corpus/generate.py). Same seed, same bytes; a killed run started
again with the same arguments continues from its checkpoints.
`audit`: replays every gate and looks for leaks of public ARC data (training/corpus/audit.py); exit 1 on a finding.
`probe` is still to come (README in this folder).
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import numpy as np
from rich.progress import track

from training.corpus import admission, audit, dsl, generate, rules, scenes

DEFAULT_ARC_DATA = Path(os.environ.get("ARC_DATA", Path(__file__).resolve().parents[3] / "shared" / "arc-data"))


def funnel_table(funnel: dict[str, int]) -> str:
    """The funnel as a Markdown table, verdicts in admission's order.

    >>> print(funnel_table({"admitted": 3, "near_raw": 1}))
    | verdict | candidates |
    | --- | --- |
    | admitted | 3 |
    | redundant_stage | 0 |
    | too_few_valid | 0 |
    | duplicate_raw | 0 |
    | duplicate_dihedral | 0 |
    | near_raw | 1 |
    | near_dihedral | 0 |
    | total | 4 |
    """
    rows = [f"| {reason} | {funnel.get(reason, 0)} |" for reason in admission.REASONS]
    total = sum(funnel.get(reason, 0) for reason in admission.REASONS)
    return "\n".join(["| verdict | candidates |", "| --- | --- |", *rows, f"| total | {total} |"])


def plot_funnel(funnel: dict[str, int], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 3))
    counts = [funnel.get(reason, 0) for reason in admission.REASONS]
    ax.barh(list(admission.REASONS)[::-1], counts[::-1], color="tab:blue")
    ax.set_xlabel("candidates")
    ax.set_title(f"admission funnel ({sum(counts)} candidates)")
    fig.tight_layout()
    fig.savefig(path, dpi=100, metadata={"Software": None})  # no version stamp: same seed, same bytes
    plt.close(fig)


def admit(candidates: int, seed: int, out: Path) -> dict[str, int]:
    programs = dsl.all_programs()
    if not 1 <= candidates <= len(programs):
        raise SystemExit(f"--candidates: must be 1..{len(programs)}, got {candidates}")
    order = np.random.default_rng(seed).permutation(len(programs))[:candidates]
    probes = scenes.probe_bank()
    adm = admission.Admitter(len(probes))
    admitted = []
    for i in track(order, description="admitting"):
        program = programs[int(i)]
        if admission.admit_program(adm, program, probes).reason == "admitted":
            admitted.append(program)
    out.mkdir(parents=True, exist_ok=True)
    (out / "rules.jsonl").write_text("".join(
        json.dumps({"id": dsl.rule_id(p), "rule": dsl.to_dict(p)}, sort_keys=True) + "\n" for p in admitted))
    funnel = {reason: adm.funnel.get(reason, 0) for reason in admission.REASONS}
    (out / "funnel.json").write_text(json.dumps({"seed": seed, "candidates": candidates, "funnel": funnel},
                                                indent=2) + "\n")
    plot_funnel(funnel, out / "funnel.png")
    return funnel


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m training.corpus", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_admit = sub.add_parser("admit", help="run admission over sampled programs")
    p_admit.add_argument("--candidates", type=int, default=300)
    p_admit.add_argument("--seed", type=int, default=0)
    p_admit.add_argument("--out", type=Path, required=True)
    p_gen = sub.add_parser("generate", help="admit rules and write gated ARC tasks with a manifest")
    p_gen.add_argument("--families", default=",".join(rules.FAMILIES),
                       help=f"comma-separated; available: {', '.join(rules.FAMILIES)}")
    p_gen.add_argument("--rules", type=int, default=20, help="rules admitted at each depth")
    p_gen.add_argument("--depth", type=int, default=1, help="composites of up to this many rules (1: none)")
    p_gen.add_argument("--tries", type=int, default=3, help="task proposals per task")
    p_gen.add_argument("--workers", type=int, default=min(2, os.cpu_count() or 1))
    p_gen.add_argument("--tasks-per-rule", type=int, default=2)
    p_gen.add_argument("--seed", type=int, default=0)
    p_gen.add_argument("--out", type=Path, required=True)
    p_audit = sub.add_parser("audit", help="replay every gate and check for leaks of public ARC data")
    p_audit.add_argument("corpus", type=Path)
    p_audit.add_argument("--arc-data", type=Path, default=DEFAULT_ARC_DATA,
                         help="folder of ARC task JSON files, searched recursively (default: $ARC_DATA or "
                              "../shared/arc-data)")
    args = parser.parse_args(argv)
    if args.command == "audit":
        if not args.arc_data.is_dir():
            parser.error(f"--arc-data: {args.arc_data} is not a folder")
        findings = audit.audit(args.corpus, args.arc_data)
        for f in findings:
            print(f"{f.task}: {f.kind}: {f.detail}")
        print(f"{len(findings)} findings")
        raise SystemExit(1 if findings else 0)
    if args.command == "admit":
        print(funnel_table(admit(args.candidates, args.seed, args.out)))
        return
    families = args.families.split(",")
    unknown = sorted(set(families) - set(rules.FAMILIES))
    if unknown:
        parser.error(f"--families: {unknown} not available (have {list(rules.FAMILIES)})")
    if args.depth < 1 or args.rules < 1 or args.workers < 1:
        parser.error("--depth, --rules and --workers must be >= 1")
    generate.generate(args.rules, args.tasks_per_rule, args.seed, args.out, tries=args.tries, families=families,
                      depth=args.depth, workers=args.workers)
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
