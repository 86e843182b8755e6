"""Lay out the offline Kaggle dataset: wheels, model, kit code and a manifest of checksums.

    python -m build.bundle --profile NAME --model DIR --out DIR [--grid-model DIR] [--target cpu-py311]
                           [--id user/slug]
    python -m build.bundle verify DIR

Layout: `wheels/` (the target's locked wheels, offline_wheels/), `model/` (the checkpoint to serve), `kit/` (the
solver's code, the profiles, the runtime requirements and the bundle's profile name), `manifest.json` (every file
with size and sha256, the lock, the kit's git commit, the model's provenance: source, expert list, recipe, patch, as
build/ recorded them) and `dataset-metadata.json` for the Kaggle CLI (`kaggle datasets create -p DIR`). Files above
`--max-file-bytes` are split into numbered parts and reassembled at boot (submission/boot.py). `verify` re-checks
every hash and says what is wrong. A grid-line profile (`line = "grid"`) bundles build.grid_vocab's 16-token
checkpoint the same way; boot runs it through submission.main, which hands it to the grid line. A combined profile
(`line = "both"`) takes two: `--model` the reasoning line's checkpoint into `model/`, `--grid-model` the 16-token grid
model into `grid-model/`, both in the manifest; `kit/bundle.json` says `"line": "both"` and boot runs
submission.grid.both with both. The notebook is kaggle/notebook.ipynb (build.notebook).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from offline_wheels.lock import LOCKS, fetch, sha256, target as target_spec
from submission.bundle_files import MODEL_DIRS, manifest_problems

ROOT = Path(__file__).resolve().parents[1]
KIT_PATHS = ("submission", "profiles", "requirements", "examples")
PART = ".part"


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                              check=True).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _provenance(model: Path) -> dict:
    out: dict = {"source": str(model.resolve())}
    config = json.loads((model / "config.json").read_text()) if (model / "config.json").exists() else {}
    for name, key in (("pruning.json", "pruning"), ("quantization_report.json", "quantization")):
        if (model / name).exists():
            raw = json.loads((model / name).read_text())
            out[key] = {k: v for k, v in raw.items() if k not in ("tensors", "kept")}
    if "arc_kit_patches" in config:
        out["patches"] = config["arc_kit_patches"]
    return out


def _split(path: Path, limit: int, block: int = 64 << 20) -> None:
    """`path` into numbered parts of `limit` bytes, copied `block` bytes at a time (a part of 20 GiB read at once
    would need 20 GiB of memory)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        for number, start in enumerate(range(0, size, limit)):
            with open(path.parent / f"{path.name}{PART}{number:03d}", "wb") as part:
                left = min(limit, size - start)
                while left:
                    piece = f.read(min(block, left))
                    part.write(piece)
                    left -= len(piece)
    path.unlink()


def manifest_files(out: Path) -> dict[str, dict]:
    return {str(p.relative_to(out)): {"bytes": p.stat().st_size, "sha256": sha256(p)}
            for p in sorted(out.rglob("*")) if p.is_file() and p.name not in ("manifest.json",)}


PLACEHOLDER_ID = "user/arc-kit-bundle"


def choose_dataset_id(given: str | None, env: dict[str, str]) -> str:
    """The Kaggle dataset id: the one given, else KAGGLE_USERNAME's `arc-kit-bundle`, else the placeholder."""
    if given:
        return given
    user = env.get("KAGGLE_USERNAME", "").strip()
    return f"{user}/arc-kit-bundle" if user else PLACEHOLDER_ID


def upload_advice(dataset: Path, chosen_id: str) -> str:
    """What to do next: upload, or first set a real dataset id (never 'upload' a placeholder id)."""
    if chosen_id == PLACEHOLDER_ID:
        return (f"{dataset}: verified, but its dataset-metadata.json still has the placeholder id {PLACEHOLDER_ID!r}: "
                f"set your own (edit \"id\" there, or build again with --id YOURNAME/SLUG or KAGGLE_USERNAME set), "
                f"then upload with `kaggle datasets create -p {dataset}`")
    return f"{dataset}: verified; upload as {chosen_id} with `kaggle datasets create -p {dataset}`"


def bundled_line(profile: str) -> str:
    """The line a bundle of `profile` runs, "grid", "both" or "reasoning", once its loader accepts it (a combined
    profile's two line profiles included: a broken profile is refused before gigabytes are copied)."""
    from submission.config import load_profile
    from submission.grid import profile_line
    from submission.grid.both import line_configs, load_both_profile
    from submission.grid.config import load_grid_profile

    line = profile_line(profile)
    if line == "both":
        line_configs(load_both_profile(profile))
    else:
        (load_grid_profile if line == "grid" else load_profile)(profile)
    return line or "reasoning"


def model_problem(line: str, config: dict) -> str:
    """What makes a checkpoint (its config.json) the wrong model for a line, "" if nothing: the grid line needs
    build.grid_vocab's 16-token cut, the reasoning line a full vocabulary."""
    from submission.grid.format import VOCAB

    if (line == "grid") == (config.get("vocab_size") == VOCAB):
        return ""
    return (f"vocab_size {config.get('vocab_size')}: the {line} line needs "
            + (f"the {VOCAB}-token grid model (build.grid_vocab)" if line == "grid" else "a full vocabulary"))


def check_model(model: Path, line: str) -> None:
    """Refuse a folder that is no checkpoint, or the wrong model for `line` (model_problem)."""
    if not (model / "config.json").exists():
        raise ValueError(f"{model}: no config.json: not a checkpoint")
    problem = model_problem(line, json.loads((model / "config.json").read_text()))
    if problem:
        raise ValueError(f"{model}: {problem}")


def bundle(profile: str, model: Path, out: Path, target: str = "cpu-py311", dataset_id: str = PLACEHOLDER_ID,
           max_file_bytes: int = 20 * 2**30, grid_model: Path | None = None) -> Path:
    """The dataset for `profile` in `out`; a combined profile's (line "both") with `model` the reasoning line's
    checkpoint and `grid_model` the grid line's."""
    line = bundled_line(profile)
    if (line == "both") != (grid_model is not None):
        raise ValueError(f"{profile}: a combined profile bundles two models, the reasoning model and the grid model "
                         f"(--grid-model, make bundle GRID_MODEL=)" if line == "both" else
                         f"{profile}: a {line}-line profile bundles one model; --grid-model is for a combined "
                         f"profile (line = \"both\")")
    if out.exists():
        raise ValueError(f"{out}: already exists; refusing to overwrite")
    models = {MODEL_DIRS[0]: (model, "reasoning" if line == "both" else line)}
    if grid_model is not None:
        models[MODEL_DIRS[1]] = (grid_model, "grid")
    for checkpoint, runs in models.values():
        check_model(checkpoint, runs)
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "wheels").mkdir(parents=True)
    for wheel in sorted(fetch(target).glob("*.whl")):
        shutil.copy2(wheel, partial / "wheels" / wheel.name)
    for folder, (checkpoint, _) in models.items():
        shutil.copytree(checkpoint, partial / folder)
    for name in KIT_PATHS:
        shutil.copytree(ROOT / name, partial / "kit" / name, ignore=shutil.ignore_patterns("__pycache__"))
    (partial / "kit" / "bundle.json").write_text(json.dumps(
        {"profile": profile, "line": line, "target": target, "requirements": target_spec(target)["requirements"]}))
    for path in sorted(partial.rglob("*")):
        if path.is_file() and path.stat().st_size > max_file_bytes:
            _split(path, max_file_bytes)
    (partial / "dataset-metadata.json").write_text(json.dumps(
        {"title": dataset_id.split("/")[-1], "id": dataset_id, "licenses": [{"name": "other"}]}, indent=1))
    manifest = {"files": manifest_files(partial), "lock": (LOCKS / f"{target}.txt").read_text(),
                "target": target, "profile": profile, "kit_commit": _git_commit(), "model": _provenance(model),
                "split_part_suffix": PART}
    if grid_model is not None:
        manifest["grid_model"] = _provenance(grid_model)
    (partial / "manifest.json").write_text(json.dumps(manifest, indent=1))
    partial.rename(out)
    return out


def verify(folder: Path) -> list[str]:
    """What is wrong with a bundle (empty if nothing): missing, changed or unexpected files."""
    problems = manifest_problems(folder)
    listed = set(json.loads((folder / "manifest.json").read_text())["files"]) | {"manifest.json"}
    problems += [f"not in the manifest: {p.relative_to(folder)}" for p in sorted(folder.rglob("*"))
                 if p.is_file() and str(p.relative_to(folder)) not in listed]
    return problems


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["verify"]:
        problems = verify(Path(argv[1]))
        print("\n".join(problems) if problems else f"{argv[1]}: every file matches the manifest")
        return 1 if problems else 0
    parser = argparse.ArgumentParser(prog="python -m build.bundle", description=__doc__.split("\n\n")[0])
    parser.add_argument("--profile", required=True)
    parser.add_argument("--model", required=True, type=Path, help="the checkpoint (a combined profile: the "
                        "reasoning line's)")
    parser.add_argument("--grid-model", type=Path, help="a combined profile's grid model (build.grid_vocab's cut)")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--target", default="cpu-py311")
    parser.add_argument("--id", help="the Kaggle dataset id (default: KAGGLE_USERNAME/arc-kit-bundle)")
    parser.add_argument("--max-file-bytes", type=int, default=20 * 2**30)
    args = parser.parse_args(argv)
    try:
        chosen = choose_dataset_id(args.id, dict(os.environ))
        print(upload_advice(bundle(args.profile, args.model, args.out, args.target, chosen, args.max_file_bytes,
                                   args.grid_model), chosen))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
