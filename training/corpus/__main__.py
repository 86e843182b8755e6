"""python -m training.corpus admit --candidates 300 --seed 0 --out runs/corpus-admit
python -m training.corpus generate --rules 20 --tasks-per-rule 2 --seed 0 --out runs/corpus
python -m training.corpus audit runs/corpus [--arc-data ../shared/arc-data]

`admit`: admission over sampled select-mask-render programs; writes `rules.jsonl` (one admitted rule per line, id and
canonical JSON, in admission order), `funnel.json` and `funnel.png` (candidates per verdict), and prints the funnel.
`generate`: gated ARC tasks and a manifest (training/corpus/generate.py). Same seed, same bytes.
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
    p_gen.add_argument("--families", default="select_mask_render",
                       help=f"comma-separated; available: {', '.join(dsl.FAMILIES)}")
    p_gen.add_argument("--rules", type=int, default=20)
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
    unknown = sorted(set(args.families.split(",")) - set(dsl.FAMILIES))
    if unknown:
        parser.error(f"--families: {unknown} not available (have {list(dsl.FAMILIES)})")
    counts = generate.generate(args.rules, args.tasks_per_rule, args.seed, args.out)
    print("\n".join(["| gate verdict | tasks |", "| --- | --- |", *(f"| {k} | {v} |" for k, v in
                                                            sorted(counts.items()))]))


if __name__ == "__main__":
    main()
