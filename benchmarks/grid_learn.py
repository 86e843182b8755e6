"""The grid line learns at CPU scale (issue 45 section 5): a tiny grid model pre-trained from random weights, then the
whole line through submission.main on held-out tasks, under an ablation of its stages, scored.

    python benchmarks/grid_learn.py [--out out/grid-learn] [--steps 1500] [--rules 70] [--eval-tasks 6] [--majority 4]
                                    [--hidden 128] [--layers 2] [--rank 64] [--task-s 40] [--ttt-sequences 256]
                                    [--ttt-lr 3e-3] [--variants no-ttt,ttt,ttt+rescore,unseeded]

1. Corpus: `training.corpus generate --rules R --depth 1 --tasks-per-rule 2 --seed 0` (kept when its folder exists):
   tasks/ are pre-training tasks, heldout/ (5% of each family's rules: one per family from R = 70) a panel.
2. Model: build.models.tiny's Qwen3 (random weights, `--hidden` / `--layers` widen it) cut to kit16 by
   build.models.grid_vocab.
3. Pre-training: `training.grid_tune` (its LoRA of rank `--rank`, embeddings and head in full) for `--steps` steps over
   the corpus's tasks and ARC-AGI-1's training tasks but the dihedral panel's; the runs load its adapter (--adapter).
4. Panels, none of them pre-trained on: `corpus` (held-out rules), `dihedral` (the 7 ARC-AGI-1 training tasks one
   fixed dihedral transform solves, left out of pre-training), `arc1-eval` (ARC-AGI-1 evaluation's `--eval-tasks`
   shortest by queue.task_cost) and `majority` (`--majority` synthetic tasks of 5582e5ca's rule, 8 demonstrations
   each, drawn by seed: `majority_task`, the task tests/test_grid_learns.py shows the line learns from random weights).
5. Variants, each a profile written from grid-tiny (`--task-s` per task, `--ttt-sequences` training steps at most at
   `--ttt-lr`, ttt.share 0.5, the adapter as model.adapter), one `python -m submission.main` run over all panels each:

       no-ttt       ttt.lr 0: one training step that changes nothing, the pre-trained adapter as loaded
       ttt          the task's training, rescore.views 0 (candidates ranked by their search hits alone)
       ttt+rescore  the line as shipped: training, the seeded search, the rescoring (the baseline of the ratios)
       unseeded     ttt+rescore with search.guess false: the same answers where the search completes, more steps

Printed: per variant and panel the test inputs answered right (either attempt) of those scored, submission.score's
task-weighted score, the search's model steps and the training steps (the attempt log's grid_line), and each
variant's right answers as a ratio to ttt+rescore's. Target: ttt+rescore answers more inputs right than no-ttt
(learning shows); a change that breaks the training (a wrong loss mask, a wrong inverse view)
shows as that target missed. Approximate: task limits and the steps the training plans are measured on a shared
CPU (ttt.share of a task's limit, submission.grid.ttt.plan_steps), so counts can move between runs under load; the
knobs above grow every stage (the recorded run's command is in benchmarks/RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from targets import Targets  # noqa: E402

from submission.attempts import read_log  # noqa: E402
from submission.grid.queue import task_cost  # noqa: E402
from submission.profiles import load_grid_profile, to_toml  # noqa: E402
from submission.score import score  # noqa: E402
from submission.tasks import Pair, Task, load_tasks  # noqa: E402

ARC = Path(os.environ.get("ARC_DATA", Path(__file__).resolve().parents[2] / "shared" / "arc-data"))
ROOT = Path(__file__).resolve().parents[1]
# ARC-AGI-1 training tasks whose every pair (test included) is one fixed dihedral transform of its input
DIHEDRAL = ("3c9b0459", "6150a2bd", "67a3c6ac", "68b16354", "74dd1130", "9dfd6313", "ed36ccf7")
VARIANTS = ("no-ttt", "ttt", "ttt+rescore", "unseeded")
BASELINE = "ttt+rescore"


def majority_task(pairs: int = 9, seed: int = 0) -> Task:
    """ARC-AGI-1 training's 5582e5ca rule (fill the grid with its majority colour) on fresh 3x3 grids: one colour on 5
    cells, the other 4 drawn from the other nine colours; the last pair is the test (tests/test_grid_learns.py's
    task, and this benchmark's `majority` panel)."""
    rng = random.Random(seed)
    drawn = []
    for _ in range(pairs):
        colour = rng.randrange(10)
        cells = [colour] * 5 + [rng.choice([c for c in range(10) if c != colour]) for _ in range(4)]
        rng.shuffle(cells)
        drawn.append(Pair(tuple(tuple(cells[3 * r:3 * r + 3]) for r in range(3)), ((colour,) * 3,) * 3))
    test = drawn.pop()
    return Task(f"majority-{seed}", tuple(drawn), (test.input,), (test.output,))


def write_task(task: Task, folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{task.id}.json"
    path.write_text(json.dumps({"train": [{"input": p.input, "output": p.output} for p in task.train],
                                "test": [{"input": i, "output": o} for i, o in zip(task.test_inputs,
                                                                                    task.test_outputs)]}))
    return path


def run(argv: list[str]) -> None:
    print("+", " ".join(argv), flush=True)
    subprocess.run(argv, check=True, cwd=ROOT)


def link_tasks(files: list[Path], folder: Path) -> Path:
    """A task folder of links to `files` (load_tasks reads a folder; a task's id is its file's stem)."""
    folder.mkdir(parents=True, exist_ok=True)
    for file in files:
        target = folder / file.name
        if not target.exists():
            target.symlink_to(file.resolve())
    return folder


def variant_profile(name: str, args: argparse.Namespace, adapter: Path) -> str:
    """grid-tiny with the pre-trained adapter, this benchmark's task limit and training length, then the variant's
    change, as TOML."""
    tiny = load_grid_profile("grid-tiny")
    sequences = args.ttt_sequences
    ttt = replace(tiny.ttt, sequences=sequences, colour_perms=max(tiny.ttt.colour_perms, math.ceil(sequences / 8)),
                  share=0.5, lr=args.ttt_lr)
    profile = replace(tiny, name=f"grid-learn-{name}", ttt=ttt, model=replace(tiny.model, adapter=str(adapter)),
                      run=replace(tiny.run, min_task_s=args.task_s, max_task_s=args.task_s))
    if name == "no-ttt":
        profile = replace(profile, ttt=replace(ttt, lr=0.0, sequences=1))
    elif name == "ttt":
        profile = replace(profile, rescore=replace(profile.rescore, views=0))
    elif name == "unseeded":
        profile = replace(profile, search=replace(profile.search, guess=False))
    return to_toml(profile)


def tally(out: Path, panels: dict[str, set[str]], labels: dict) -> dict[str, dict]:
    """Per panel: inputs right, inputs, task-weighted score, search and training steps (the log's grid_line)."""
    answers = json.loads((out / "submission.json").read_text())
    steps: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for record in read_log(out / "attempts.jsonl"):
        detail = record.grid_line
        if record.attempt == 1 and detail is not None and detail.search_steps is not None:
            steps[record.task_id][0] += detail.search_steps if record.test_index == 0 else 0
            steps[record.task_id][1] = detail.ttt_steps or 0
    rows = {}
    for panel, ids in panels.items():
        report = score({t: answers.get(t) for t in ids if t in answers}, {t: labels[t] for t in ids})
        rows[panel] = dict(right=sum(sum(t.right) for t in report.tasks),
                           inputs=sum(len(t.right) for t in report.tasks), score=report.task_weighted,
                           search_steps=sum(steps[t][0] for t in ids), ttt_steps=sum(steps[t][1] for t in ids))
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=ROOT / "out" / "grid-learn")
    parser.add_argument("--rules", type=int, default=70, help="corpus rules (depth 1)")
    parser.add_argument("--steps", type=int, default=1500, help="pre-training steps (training.grid_tune)")
    parser.add_argument("--lr", type=float, default=1e-3, help="pre-training learning rate")
    parser.add_argument("--rank", type=int, default=64, help="pre-training LoRA rank")
    parser.add_argument("--hidden", type=int, default=128, help="the model's hidden width (build.models.tiny's 128)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--eval-tasks", type=int, default=6, help="ARC-AGI-1 evaluation tasks (the shortest)")
    parser.add_argument("--majority", type=int, default=4, help="synthetic majority-colour tasks (seeds 0..N-1)")
    parser.add_argument("--task-s", type=float, default=40.0, help="each task's time limit")
    parser.add_argument("--ttt-sequences", type=int, default=256, help="each task's training steps, at most")
    parser.add_argument("--ttt-lr", type=float, default=3e-3, help="each task's learning rate")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    args = parser.parse_args(argv)
    out, py = args.out.resolve(), sys.executable
    out.mkdir(parents=True, exist_ok=True)

    corpus = out / "corpus"
    if not (corpus / "gate.json").exists():
        run([py, "-m", "training.corpus", "generate", "--rules", str(args.rules), "--depth", "1",
             "--tasks-per-rule", "2", "--tries", "2", "--seed", "0", "--workers", "0", "--out", str(corpus)])
    grid = out / "grid"
    if not (grid / "config.json").exists():
        from build.models.grid_vocab import cut
        from build.models.tiny import make_checkpoint

        widths = dict(hidden_size=args.hidden, intermediate_size=2 * args.hidden, num_hidden_layers=args.layers)
        cut(make_checkpoint(out / "base", "qwen3", seed=0, widths=widths), grid)
    arc1 = ARC / "arc-agi-1"
    pretrain_arc = link_tasks([f for f in sorted((arc1 / "training").glob("*.json")) if f.stem not in DIHEDRAL],
                              out / "pretrain-arc1")
    tune = out / "tune"
    if not (tune / "adapter" / "adapter_config.json").exists():
        run([py, "-m", "training.grid_tune", "--model", str(grid), "--format", "kit16", "--dtype", "float32",
             "--tasks", str(corpus / "tasks"), "--tasks", str(pretrain_arc), "--steps", str(args.steps),
             "--checkpoint-every", str(max(args.steps // 4, 1)), "--rank", str(args.rank), "--lr", str(args.lr),
             "--max-len", "2048", "--out", str(tune)])
    losses = json.loads((tune / "losses.json").read_text())

    shortest = sorted(load_tasks(arc1 / "evaluation").tasks, key=task_cost)[:args.eval_tasks]
    files = {"corpus": sorted((corpus / "heldout").glob("*.json")),
             "dihedral": [arc1 / "training" / f"{t}.json" for t in DIHEDRAL],
             "arc1-eval": [arc1 / "evaluation" / f"{t.id}.json" for t in shortest],
             "majority": [write_task(majority_task(seed=seed), out / "majority") for seed in range(args.majority)]}
    panels = {name: {f.stem for f in fs} for name, fs in files.items()}
    tasks = link_tasks([f for fs in files.values() for f in fs], out / "panels")
    labels = {t.id: t.test_outputs for t in load_tasks(tasks).tasks}
    deadline = math.ceil(len(labels) / 2) * args.task_s * 1.3 + 120  # two workers, their loading, the margins

    results = {}
    for name in args.variants.split(","):
        folder = out / "runs" / name
        if not (folder / "submission.json").exists() or not (folder / "done").exists():
            folder.mkdir(parents=True, exist_ok=True)
            for stale in ("attempts.jsonl", "submission.json", "heartbeat.json"):
                (folder / stale).unlink(missing_ok=True)
            (folder / "profile.toml").write_text(variant_profile(name, args, tune / "adapter"))
            run([py, "-m", "submission.main", "--tasks", str(tasks), "--profile", str(folder / "profile.toml"),
                 "--model", str(grid), "--deadline", str(int(deadline)),
                 "--out", str(folder / "submission.json"), "--log", str(folder / "attempts.jsonl")])
            (folder / "done").write_text("")
        results[name] = tally(folder, panels, labels)

    print(f"\npre-training: {len(losses)} steps, loss {losses[0]:.3f} -> "
          f"{sum(losses[-50:]) / len(losses[-50:]):.3f} (mean of the last 50)")
    print("| variant | " + " | ".join(f"{p} right / inputs (score)" for p in panels) + " | search steps | "
          f"ttt steps | right vs {BASELINE} |")
    print("| --- |" + " --- |" * (len(panels) + 3))
    base = sum(r["right"] for r in results.get(BASELINE, {}).values())
    for name, rows in results.items():
        right = sum(r["right"] for r in rows.values())
        ratio = f"{right / base:.2f}x" if base else f"{right} vs 0"
        print(f"| {name} | " + " | ".join(f"{r['right']} / {r['inputs']} ({r['score']:.1f})" for r in rows.values())
              + f" | {sum(r['search_steps'] for r in rows.values())} | {sum(r['ttt_steps'] for r in rows.values())}"
              f" | {ratio} |")
    targets = Targets()
    if "no-ttt" in results and BASELINE in results:
        gain = sum(r["right"] for r in results[BASELINE].values()) - sum(r["right"] for r in results["no-ttt"].values())
        targets.at_least(f"inputs right with the task's training ({BASELINE}) minus without (no-ttt)", gain, 1)
    return targets.exit_code()


if __name__ == "__main__":
    sys.exit(main())
