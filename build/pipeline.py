"""From a checkpoint to a Kaggle dataset in one command: prune, patch, quantise, bundle (each step optional).

    python -m build.pipeline --profile NAME --out DIR [--model DIR] [--grid-model DIR] [--adapter DIR] [--target T]
                             [--list LIST.json] [--recipe RECIPE.toml] [--calibration-tasks ARC_DIR] [--id USER/SLUG]

The profile's [build] section names the target, the expert list, the recipe and the calibration tasks; the options
override it. Without --model a tiny random-weight Qwen3 is built (the CPU demo). A step runs when its input is given
(a list: build.prune; a recipe: build.quantize); the end-of-turn patch runs unless the checkpoint records it
already; the order is prune, patch, quantise (`chain`, which training.rft's merge runs too); then build.bundle lays
out DIR/dataset and verifies it. Intermediate checkpoints stay in DIR/steps. A grid-line profile's checkpoint
(build.models.grid_vocab's cut) is bundled as it is; without --model the tiny Qwen3 is cut to the grid vocabulary first.
A combined profile (`line = "both"`) bundles two: --model, the reasoning line's, goes through the steps as its line
profile's [build] section says; --grid-model (without it the tiny Qwen3 cut to 16 tokens) goes in as it is; the two
line profiles must name the same wheel target.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import Callable

from build.bundle.bundler import PLACEHOLDER_ID, bundle, choose_dataset_id, upload_advice, verify
from build.patch_eot import PATCH_KEY, patch
from build.prune.pruner import prune
from build.quantize.quantizer import calibrated_scales, quantize
from submission.kaggle.mounts import COMPETITION
from submission.profiles import profile_line


def run(profile: str, target: str, out: Path, model: Path | None = None, expert_list: Path | None = None,
        recipe: Path | None = None, calibration_tasks: Path | None = None, dataset_id: str = PLACEHOLDER_ID,
        grid_model: Path | None = None, competition: str = COMPETITION, adapter: Path | None = None) -> Path:
    steps = out / "steps"
    steps.mkdir(parents=True, exist_ok=True)
    line = profile_line(profile)
    grid = line == "grid"
    if grid and (expert_list or recipe or calibration_tasks):
        raise ValueError(f"{profile}: a grid-line profile bundles its checkpoint as it is (no list, recipe or "
                         f"calibration tasks)")
    if line != "both" and grid_model is not None:
        raise ValueError(f"{profile}: --grid-model is for a combined profile (line = \"both\")")
    if model is None or (line == "both" and grid_model is None):
        from build.models.grid_vocab import cut
        from build.models.tiny import make_checkpoint

        tiny = make_checkpoint(steps / "tiny", "qwen3", seed=0)
        if line == "both" and grid_model is None:
            grid_model = cut(tiny, steps / "tiny-grid")
        if model is None:
            model = cut(tiny, steps / "tiny-grid") if grid else tiny
    model = chain(model, lambda step: steps / step, expert_list, recipe, calibration_tasks,
                  end_of_turn=not grid)  # no turns on the grid line
    dataset = bundle(profile, model, out / "dataset", target, dataset_id, grid_model=grid_model,
                     competition=competition, adapter=adapter)
    problems = verify(dataset)
    if problems:
        raise ValueError(f"{dataset}: " + "; ".join(problems))
    return dataset


def chain(model: Path, out: Callable[[str], Path], expert_list: Path | None = None, recipe: Path | None = None,
          calibration_tasks: Path | None = None, end_of_turn: bool = True, kv_scales: bool = True) -> Path:
    """The build chain in its one order, each step optional: prune (with a list), the end-of-turn patch (with
    `end_of_turn`, unless the checkpoint records it already), quantise (with a recipe; with calibration tasks its
    KV-cache scales, kept unless `kv_scales` is off, and static input scales are observed on the patched model).
    `out(step)` is the folder of step "pruned", "patched" or "quantized"; returns the last checkpoint written (the
    input when no step runs). Used by this module's `run` and by training.rft's merge.

    Patch before quantising: the patch edits the output head's rows and, for a tied head, makes the head from the
    embeddings. After quantisation a quantised head has no `lm_head.weight` to edit (NVFP4 stores `weight_packed`:
    the patch would write a second, BF16 head beside it and leave the real one unpatched), and a tied head, absent
    when the recipe is planned, would skip the recipe's `lm_head` rule and stay BF16. Quantising the patched head
    keeps the zeroed rows exactly zero (a zero row quantises to zero at any scale)."""
    if expert_list is not None:
        model = prune(model, expert_list, out("pruned"))
    if end_of_turn and PATCH_KEY not in json.loads((model / "config.json").read_text()):
        patch(model, out("patched"))
        model = out("patched")
    if recipe is not None:
        kv = amax = None
        if calibration_tasks is not None:  # new weights, new activations: scales of another checkpoint do not hold
            from submission.tasks import load_tasks

            kv, amax = calibrated_scales(model, recipe, load_tasks(calibration_tasks).tasks, 256)
            kv = kv if kv_scales else None
        quantize(model, recipe, out("quantized"), kv, amax)
        model = out("quantized")
    return model


def build_plan(profile: str):
    """The [build] section that steers the steps: the profile's own; a combined profile's reasoning line profile's
    (its grid model goes in as it is), refused when its grid line profile names other wheels (one bundle installs
    one set)."""
    from submission.profiles import line_configs, load, load_both_profile, path_of

    line = profile_line(profile)
    if line != "both":
        return load(profile).build
    both = load_both_profile(profile)
    reasoning, grid = line_configs(both)
    if reasoning.build.target != grid.build.target:
        raise ValueError(f"{path_of(profile)}: reasoning.profile {both.reasoning.profile} builds for target "
                         f"{reasoning.build.target!r}, grid.profile {both.grid.profile} for {grid.build.target!r}: "
                         f"one bundle installs one set of wheels")
    return reasoning.build


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m build.pipeline", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True)
    parser.add_argument("--target")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--model", type=Path, help="the checkpoint (a combined profile: the reasoning line's)")
    parser.add_argument("--grid-model", type=Path,
                        help="a combined profile's grid model (build.models.grid_vocab's cut)")
    parser.add_argument("--adapter", type=Path, help="the grid line's PEFT adapter, bundled inside its model where "
                        "the profile's model.adapter names it (build.bundle)")
    parser.add_argument("--list", type=Path)
    parser.add_argument("--recipe", type=Path)
    parser.add_argument("--calibration-tasks", type=Path)
    parser.add_argument("--id", help="the Kaggle dataset id (default: KAGGLE_USERNAME/arc-kit-bundle)")
    parser.add_argument("--competition", default=COMPETITION, help="the competition's slug: its data's mount name")
    args = parser.parse_args(argv)
    try:
        plan = build_plan(args.profile)
    except ValueError as err:
        parser.error(str(err))

    def chosen(option, configured: str):
        return option if option is not None else (Path(configured) if configured else None)

    chosen_id = choose_dataset_id(args.id, dict(os.environ))
    planned = {key: getattr(plan, key, "") for key in ("expert_list", "recipe", "calibration_tasks")}  # grid: none
    dataset = run(args.profile, args.target or plan.target, args.out, args.model,
                  chosen(args.list, planned["expert_list"]), chosen(args.recipe, planned["recipe"]),
                  chosen(args.calibration_tasks, planned["calibration_tasks"]), chosen_id, args.grid_model,
                  args.competition, args.adapter)
    print(upload_advice(dataset, chosen_id))


if __name__ == "__main__":
    main()
