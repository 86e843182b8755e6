"""From a checkpoint to a Kaggle dataset in one command: prune, quantise, patch, bundle (each step optional).

    python -m build.pipeline --profile NAME --out DIR [--model DIR] [--target T] [--list LIST.json]
                             [--recipe RECIPE.toml] [--calibration-tasks ARC_DIR] [--id USER/SLUG]

The profile's [build] section names the target, the expert list, the recipe and the calibration tasks; the options
override it. Without --model a tiny random-weight Qwen3 is built (the CPU demo). A step runs when its input is given
(a list: build.prune; a recipe: build.quantize); the end-of-turn patch runs unless the checkpoint records it
already; then build.bundle lays out DIR/dataset and verifies it. Intermediate checkpoints stay in DIR/steps. A
grid-line profile's checkpoint (build.grid_vocab's cut) is bundled as it is; without --model the tiny Qwen3 is cut to
the grid vocabulary first.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

from build.bundle import PLACEHOLDER_ID, bundle, choose_dataset_id, upload_advice, verify
from build.patch_eot import PATCH_KEY, patch
from build.prune import prune
from build.quantize import calibrated_scales, quantize
from submission.grid import profile_line


def run(profile: str, target: str, out: Path, model: Path | None = None, expert_list: Path | None = None,
        recipe: Path | None = None, calibration_tasks: Path | None = None, dataset_id: str = PLACEHOLDER_ID) -> Path:
    steps = out / "steps"
    steps.mkdir(parents=True, exist_ok=True)
    grid = profile_line(profile) == "grid"
    if grid and (expert_list or recipe or calibration_tasks):
        raise ValueError(f"{profile}: a grid-line profile bundles its checkpoint as it is (no list, recipe or "
                         f"calibration tasks)")
    if model is None:
        from build.tiny import make_checkpoint

        model = make_checkpoint(steps / "tiny", "qwen3", seed=0)
        if grid:
            from build.grid_vocab import cut

            model = cut(model, steps / "tiny-grid")
    if expert_list is not None:
        model = prune(model, expert_list, steps / "pruned")
    if recipe is not None:
        kv = amax = None
        if calibration_tasks is not None:
            from submission.tasks import load_tasks

            kv, amax = calibrated_scales(model, recipe, load_tasks(calibration_tasks).tasks, 256)
        quantize(model, recipe, steps / "quantized", kv, amax)
        model = steps / "quantized"
    if not grid and PATCH_KEY not in json.loads((model / "config.json").read_text()):  # no turns on the grid line
        patch(model, steps / "patched")
        model = steps / "patched"
    dataset = bundle(profile, model, out / "dataset", target, dataset_id)
    problems = verify(dataset)
    if problems:
        raise ValueError(f"{dataset}: " + "; ".join(problems))
    return dataset


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m build.pipeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True)
    parser.add_argument("--target")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--model", type=Path)
    parser.add_argument("--list", type=Path)
    parser.add_argument("--recipe", type=Path)
    parser.add_argument("--calibration-tasks", type=Path)
    parser.add_argument("--id", help="the Kaggle dataset id (default: KAGGLE_USERNAME/arc-kit-bundle)")
    args = parser.parse_args(argv)
    from submission.config import load_profile
    from submission.grid import NOT_BUNDLED
    from submission.grid.config import load_grid_profile

    line = profile_line(args.profile)
    if line == "both":
        parser.error(NOT_BUNDLED.format(profile=args.profile))
    plan = (load_grid_profile if line == "grid" else load_profile)(args.profile).build

    def chosen(option, configured: str):
        return option if option is not None else (Path(configured) if configured else None)

    chosen_id = choose_dataset_id(args.id, dict(os.environ))
    planned = {key: getattr(plan, key, "") for key in ("expert_list", "recipe", "calibration_tasks")}  # grid: none
    dataset = run(args.profile, args.target or plan.target, args.out, args.model,
                  chosen(args.list, planned["expert_list"]), chosen(args.recipe, planned["recipe"]),
                  chosen(args.calibration_tasks, planned["calibration_tasks"]), chosen_id)
    print(upload_advice(dataset, chosen_id))


if __name__ == "__main__":
    main()
