"""Lay out the offline Kaggle dataset: wheels, model, kit code and a manifest of checksums.

    python -m build.bundle --profile NAME --model DIR --out DIR [--grid-model DIR] [--adapter DIR]
                           [--target cpu-py311]
                           [--id user/slug]
    python -m build.bundle verify DIR

Layout: `wheels/` (the target's locked wheels, offline_wheels/), `model/` (the checkpoint to serve), `kit/` (the
solver's code, the profiles, the runtime requirements and the bundle's profile name), `manifest.json` (every file
with size and sha256, the lock, the kit's git commit, the model's provenance: source, expert list, recipe, patch, as
build/ recorded them) and `dataset-metadata.json` for the Kaggle CLI. The manifest lists exactly what the client
uploads (upload_commands: `kaggle datasets create -p DIR --dir-mode tar`, one archive per top-level folder; the
client never uploads dataset-metadata.json, so the manifest leaves it out, and a path it would leave out of an
archive is refused before anything is copied). Files above `--max-file-bytes` are split into numbered parts and
reassembled at boot (submission/kaggle/boot.py). `verify` re-checks every hash and says what is wrong. A grid-line
profile (`line = "grid"`) bundles build.models.grid_vocab's 16-token checkpoint the same way; boot runs it through
submission.main, which hands it to the grid line. A combined profile (`line = "both"`) takes two: `--model` the
reasoning line's checkpoint into `model/`, `--grid-model` the 16-token grid model into `grid-model/`, both in the
manifest; `kit/bundle.json` says `"line": "both"` and boot runs submission.both with both. `--adapter` puts the
grid line's fine-tuned adapter inside the grid model's folder, where the profile's relative model.adapter finds it
at run time (the base and the adapter both travel; issue 29). The notebook is
kaggle/notebook.ipynb (build.bundle.notebook).
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import shlex
import shutil
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

from offline_wheels.lock import LOCKS, fetch, sha256, target as target_spec
from submission.kaggle.bundle_files import MODEL_DIRS, manifest_problems
from submission.kaggle.mounts import COMPETITION
from submission.kaggle.supervise import SuperviseConfig

ROOT = Path(__file__).resolve().parents[2]
KIT_PATHS = ("submission", "profiles", "requirements", "examples")
PART = ".part"
METADATA = "dataset-metadata.json"  # the Kaggle CLI's, read by it and never uploaded (kaggle 2.2.5 upload_files)
# kaggle 2.2.5's DEFAULT_IGNORE_PATTERNS (kaggle/api/kaggle_api_extended.py): the client leaves out a top-level entry
# whose name matches, and inside a folder's archive every path relative to that folder that matches (a folder's with
# a trailing "/"), with everything under it. tests/test_kaggle_upload.py compares them with the installed client's.
CLIENT_IGNORES = (".git/", "*/.git/", ".cache/", ".huggingface/")
# The folders go up as one uncompressed tar each: wheels and safetensors hardly compress (zip saved 2% of the CPU
# bundle) and the client's zip is DEFLATE over every byte, 5-14x slower there (tests/test_kaggle_upload.py drives
# the client with this mode; its docstring has the timings).
DIR_MODE = "tar"
VERSION_NOTES = "what changed"


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
    """Every file the client uploads with its size and sha256: all but manifest.json and the CLI's metadata."""
    return {str(p.relative_to(out)): {"bytes": p.stat().st_size, "sha256": sha256(p)}
            for p in sorted(out.rglob("*"))
            if p.is_file() and str(p.relative_to(out)) not in ("manifest.json", METADATA)}


def _client_skips(rel: str, is_dir: bool) -> str:
    """The pattern by which the client skips `rel` (kaggle 2.2.5's should_ignore: fnmatch, a folder's path with a
    trailing "/", "/"-ending patterns match folders only), "" if none."""
    path = rel + "/" if is_dir else rel
    return next((p for p in CLIENT_IGNORES if (is_dir or not p.endswith("/")) and fnmatch.fnmatch(path, p)), "")


def client_ignored(path: str) -> str:
    """The pattern by which the kaggle client would leave the bundle's file `path` ("/"-separated) out of an upload:
    its top-level folder, a folder inside it (as a path relative to the top-level folder) or the file itself; ""
    if none."""
    top, *inner = path.split("/")
    if not inner:
        return _client_skips(top, False)
    checks = [(top, True)] + [("/".join(inner[:i]), True) for i in range(1, len(inner))] + [("/".join(inner), False)]
    return next((pattern for rel, is_dir in checks if (pattern := _client_skips(rel, is_dir))), "")


def refuse_client_ignored(sources: dict[str, Path]) -> None:
    """Refuse, before anything is copied, a file the client would leave out (boot would then find it missing):
    `sources` maps each bundle folder to the folder it is copied from."""
    left_out = [(f"{folder}/{p.relative_to(source).as_posix()}", source) for folder, source in sources.items()
                for p in sorted(source.rglob("*")) if p.is_file()]
    left_out = [(path, source, pattern) for path, source in left_out if (pattern := client_ignored(path))]
    if left_out:
        path, source, pattern = left_out[0]
        raise ValueError(f"{path} (from {source}): the kaggle client leaves paths matching {pattern!r} out of an "
                         f"upload, so boot would find {len(left_out)} file(s) missing; remove them from {source} "
                         f"first (`hf download --local-dir` leaves a .cache/ folder in the checkpoint)")


PLACEHOLDER_ID = "user/arc-kit-bundle"


def choose_dataset_id(given: str | None, env: dict[str, str]) -> str:
    """The Kaggle dataset id: the one given, else KAGGLE_USERNAME's `arc-kit-bundle`, else the placeholder."""
    if given:
        return given
    user = env.get("KAGGLE_USERNAME", "").strip()
    return f"{user}/arc-kit-bundle" if user else PLACEHOLDER_ID


def upload_commands(dataset: Path, notes: str = VERSION_NOTES) -> tuple[list[str], list[str]]:
    """The client's commands that upload `dataset`: the first upload, and a new version of it (an update). Without
    `--dir-mode` the client uploads the top-level files only (manifest.json): no wheels, model or kit."""
    return (["kaggle", "datasets", "create", "-p", str(dataset), "--dir-mode", DIR_MODE],
            ["kaggle", "datasets", "version", "-p", str(dataset), "-m", notes, "--dir-mode", DIR_MODE])


def upload_advice(dataset: Path, chosen_id: str) -> str:
    """What to do next: upload, or first set a real dataset id (never 'upload' a placeholder id)."""
    create, version = (shlex.join(command) for command in upload_commands(dataset))
    how = (f"with `{create}` (each folder goes up as one .tar; the client writes it under $TMPDIR first), "
           f"and later versions with `{version}`")
    if chosen_id == PLACEHOLDER_ID:
        return (f"{dataset}: verified, but its {METADATA} still has the placeholder id {PLACEHOLDER_ID!r}: "
                f"set your own (edit \"id\" there, or build again with --id YOURNAME/SLUG or KAGGLE_USERNAME set), "
                f"then upload {how}")
    return f"{dataset}: verified; upload as {chosen_id} {how}"


def bundled_line(profile: str) -> str:
    """The line a bundle of `profile` runs, "grid", "both" or "reasoning", once its loader accepts it (a combined
    profile's two line profiles included: a broken profile is refused before gigabytes are copied)."""
    from submission.profiles import line_configs, load, load_both_profile, profile_line

    line = profile_line(profile)
    if line == "both":
        line_configs(load_both_profile(profile))
    else:
        load(profile)
    return line or "reasoning"


def grid_adapter(profile: str, line: str) -> str:
    """The grid line's model.adapter as `profile` names it ("" for none, or a reasoning-line profile)."""
    from submission.profiles import line_configs, load_both_profile, load_grid_profile

    if line == "both":
        return line_configs(load_both_profile(profile))[1].model.adapter
    return load_grid_profile(profile).model.adapter if line == "grid" else ""


def adapter_problem(named: str, adapter: Path | None, grid_model: Path) -> str:
    """What stops a bundle carrying the grid line's adapter, "" if nothing. The profile's model.adapter names a
    folder inside the grid model (a relative path, e.g. "adapter"); `adapter` (--adapter) is copied there, or the
    model folder already holds it. A path outside the model would not exist on Kaggle."""
    if named and Path(named).is_absolute():
        return (f"model.adapter = {named!r} is outside the bundle: name a folder inside the model "
                f"(adapter = \"adapter\") and pass the adapter with --adapter")
    if adapter is None:
        if named and not (grid_model / named / "adapter_config.json").is_file():
            return (f"model.adapter = {named!r}: {grid_model / named}/adapter_config.json is missing "
                    f"(pass the adapter with --adapter DIR)")
        return ""
    if not named:
        return "--adapter needs a grid-line profile whose model.adapter names its folder (adapter = \"adapter\")"
    if not (adapter / "adapter_config.json").is_file():
        return f"--adapter: {adapter}/adapter_config.json is missing (training.grid_tune's out/adapter)"
    if (grid_model / named).exists():
        return f"--adapter: {grid_model / named} exists already: one adapter, from one place"
    return ""


def model_problem(line: str, config: dict) -> str:
    """What makes a checkpoint (its config.json) the wrong model for a line, "" if nothing: the grid line needs
    build.models.grid_vocab's 16-token cut, the reasoning line a full vocabulary."""
    from submission.grid.format import VOCAB

    if (line == "grid") == (config.get("vocab_size") == VOCAB):
        return ""
    return (f"vocab_size {config.get('vocab_size')}: the {line} line needs "
            + (f"the {VOCAB}-token grid model (build.models.grid_vocab)" if line == "grid" else "a full vocabulary"))


def check_model(model: Path, line: str) -> None:
    """Refuse a folder that is no checkpoint, or the wrong model for `line` (model_problem)."""
    if not (model / "config.json").exists():
        raise ValueError(f"{model}: no config.json: not a checkpoint")
    problem = model_problem(line, json.loads((model / "config.json").read_text()))
    if problem:
        raise ValueError(f"{model}: {problem}")


def bundle(profile: str, model: Path, out: Path, target: str = "cpu-py311", dataset_id: str = PLACEHOLDER_ID,
           max_file_bytes: int = 20 * 2**30, grid_model: Path | None = None, competition: str = COMPETITION,
           boot: dict | None = None, adapter: Path | None = None) -> Path:
    """The dataset for `profile` in `out`; a combined profile's (line "both") with `model` the reasoning line's
    checkpoint and `grid_model` the grid line's. `adapter` (the grid line's fine-tuned PEFT adapter) goes inside the
    grid model's folder where the profile's model.adapter names it (issue 29: the run loads it on the base).
    `competition` is the slug whose mount boot reads the tasks from; `boot` overrides boot's supervision of the
    solver (submission.kaggle.supervise.SuperviseConfig's fields)."""
    line = bundled_line(profile)
    boot = asdict(SuperviseConfig(**(boot or {})))  # unknown fields refused before anything is copied
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
    grid_folder = MODEL_DIRS[1] if line == "both" else MODEL_DIRS[0]
    named = grid_adapter(profile, line)
    problem = (adapter_problem(named, adapter, models[grid_folder][0]) if line in ("grid", "both") else
               "--adapter is for a grid-line or combined profile" if adapter is not None else "")
    if problem:
        raise ValueError(f"{profile}: {problem}")
    refuse_client_ignored({**{folder: checkpoint for folder, (checkpoint, _) in models.items()},
                           **{f"kit/{name}": ROOT / name for name in KIT_PATHS}})
    partial = out.with_name(out.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    (partial / "wheels").mkdir(parents=True)
    for wheel in sorted(fetch(target).glob("*.whl")):
        shutil.copy2(wheel, partial / "wheels" / wheel.name)
    for folder, (checkpoint, _) in models.items():
        shutil.copytree(checkpoint, partial / folder)
    if adapter is not None:
        shutil.copytree(adapter, partial / grid_folder / named)
    for name in KIT_PATHS:
        shutil.copytree(ROOT / name, partial / "kit" / name, ignore=shutil.ignore_patterns("__pycache__"))
    (partial / "kit" / "bundle.json").write_text(json.dumps(
        {"profile": profile, "line": line, "target": target, "requirements": target_spec(target)["requirements"],
         "competition": competition, "boot": boot}))
    for path in sorted(partial.rglob("*")):
        if path.is_file() and path.stat().st_size > max_file_bytes:
            _split(path, max_file_bytes)
    (partial / METADATA).write_text(json.dumps(
        {"title": dataset_id.split("/")[-1], "id": dataset_id, "licenses": [{"name": "other"}]}, indent=1))
    manifest = {"files": manifest_files(partial), "lock": (LOCKS / f"{target}.txt").read_text(),
                "target": target, "profile": profile, "kit_commit": _git_commit(), "model": _provenance(model),
                "split_part_suffix": PART}
    if grid_model is not None:
        manifest["grid_model"] = _provenance(grid_model)
    if adapter is not None:
        manifest["adapter"] = {"source": str(adapter.resolve()), "folder": f"{grid_folder}/{named}"}
    (partial / "manifest.json").write_text(json.dumps(manifest, indent=1))
    partial.rename(out)
    return out


def verify(folder: Path) -> list[str]:
    """What is wrong with a bundle (empty if nothing): missing, changed or unexpected files (the CLI's metadata file,
    never uploaded, is expected and unlisted)."""
    problems = manifest_problems(folder)
    listed = set(json.loads((folder / "manifest.json").read_text())["files"]) | {"manifest.json", METADATA}
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
    parser.add_argument("--grid-model", type=Path,
                        help="a combined profile's grid model (build.models.grid_vocab's cut)")
    parser.add_argument("--adapter", type=Path, help="the grid line's PEFT adapter (training.grid_tune's out/adapter), "
                        "bundled inside the grid model where the profile's model.adapter names it")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--target", default="cpu-py311")
    parser.add_argument("--id", help="the Kaggle dataset id (default: KAGGLE_USERNAME/arc-kit-bundle)")
    parser.add_argument("--max-file-bytes", type=int, default=20 * 2**30)
    parser.add_argument("--competition", default=COMPETITION, help="the competition's slug: its data's mount name")
    args = parser.parse_args(argv)
    try:
        chosen = choose_dataset_id(args.id, dict(os.environ))
        print(upload_advice(bundle(args.profile, args.model, args.out, args.target, chosen, args.max_file_bytes,
                                   args.grid_model, args.competition, adapter=args.adapter), chosen))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
