"""build/ against tensor count: every step on the Qwen3-Next-80B topology at tiny widths (build.models.topology) with 2,
11 and 47 decoder layers (plus the MTP layer): 1x, 4x and 16x the tensors (~4.7k, ~18.6k, ~74.5k), each step's seconds
per 1,000 tensors and its ratio to a plain copy of the same files measured in the same run.

    python benchmarks/build_scale.py [--workdir /tmp/build-scale] [--layers 2,11,47] [--steps prune,quantize,...]
                                     [--tasks $ARC_DATA/arc-agi-2/training] [--width 1]

Steps, each on the previous steps' outputs: calibrate (routing statistics and REAP saliency of 4 traces of 62 tokens,
layer by layer), experts (the lists of build/lists.toml from those statistics), scales (FP8 KV-cache and static input
amax on the solver's prompts of 2 real ARC tasks, layer by layer, for a recipe with static schemes), prune (512 -> 384
experts), quantise (moe-4xL4, with and without the per-tensor error report), patch, check_quality (reference against
the patched quantised checkpoint), bundle (the source checkpoint with the CPU target's wheels: it needs no other
step).
Each runs in its own process (process start and imports included); peak RSS is that process's own (the parent never
imports torch: a child's peak starts at its parent's RSS). Baselines in the same run: a plain copy of the files, and
a safetensors load + save of every shard in a child process (at tiny widths the bytes are few and the per-tensor
cost dominates, so this is the floor a streaming converter can reach); for the bundle, a plain copy of the
checkpoint and the wheels it carries; for quantising, the start of a quantise process (imports and the compiled
loops loaded, which a copy does not pay and which does not grow with the checkpoint), so that the summary can give
quantising against copying with and without it. Also the converter's dependency lookup as it was before issue 17 (a scan of
every name per call), timed on 200 calls and extrapolated to one call per tensor.
With `--width N` the hidden and MLP sizes are N times the tiny ones (build.models.topology.WIDE): peak memory against
the bytes of one layer, to check how the README extrapolates it to the real widths; and, the bytes then outweighing the
per-tensor bookkeeping, issue 17's target that quantising the whole topology (47 layers) costs no more than a few
times (5x) a plain copy of the checkpoint, its process start included.
Run it in the build environment (make build-env), with the CPU target's wheels fetched (make wheels).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from prune_and_calibrate import peak_rss  # noqa: E402
from targets import Targets  # noqa: E402

STEPS = ("calibrate", "experts", "scales", "prune", "quantize", "quantize_no_report", "patch", "check_quality",
         "bundle")
STATIC_RECIPE = r"""name = "static"
[[rules]]
pattern = '\.mlp\.experts\.\d+\.(gate|up|down)_proj$'
scheme = "NVFP4"
[[rules]]
pattern = '\.self_attn\.(q|k|v|o)_proj$'
scheme = "FP8"
"""
# The scales step as build.quantize --calibration-tasks runs it, without the quantising that follows.
SCALES = """import sys
from build.quantize.quantizer import calibrated_scales
from submission.tasks import load_tasks
kv, amax = calibrated_scales(sys.argv[1], sys.argv[2], load_tasks(sys.argv[3]).tasks, 2)
print(len(kv), 'KV-cache scales,', len(amax), 'input amax')
"""


def commands(work: Path, tasks: Path) -> dict[str, list[str]]:
    py = [sys.executable, "-m"]
    return {
        "calibrate": py + ["build.prune.calibrate", "--model", str(work / "model"), "--traces",
                           str(work / "traces.jsonl"), "--out", str(work / "stats.npz")],
        "experts": py + ["build.prune.experts", "--stats", str(work / "stats.npz"), "--config", "build/lists.toml",
                         "--out", str(work / "lists")],
        "scales": [sys.executable, "-c", SCALES, str(work / "model"), str(work / "static.toml"), str(tasks)],
        "prune": py + ["build.prune", "--model", str(work / "model"), "--list", str(work / "list.json"),
                       "--out", str(work / "pruned")],
        "quantize": py + ["build.quantize", "--model", str(work / "pruned"), "--recipe",
                          "build/recipes/moe-4xL4.toml", "--out", str(work / "q")],
        "quantize_no_report": py + ["build.quantize", "--model", str(work / "pruned"), "--recipe",
                                    "build/recipes/moe-4xL4.toml", "--out", str(work / "q2"), "--no-report"],
        "patch": py + ["build.patch_eot", "--model", str(work / "q"), "--out", str(work / "patched")],
        "check_quality": py + ["build.check_quality", "--reference", str(work / "pruned"), "--candidate",
                               str(work / "patched"), "--traces", str(work / "traces.jsonl"), "--threshold", "100"],
        "bundle": py + ["build.bundle", "--profile", "moe-4xL4", "--model", str(work / "model"), "--out",
                        str(work / "bundle"), "--target", "cpu-py311"],
    }


def old_lookup_seconds(names: list[str], calls: int = 200) -> float:
    """Seconds per call of the pre-issue-17 `get_dependencies`: every name matched against the fused patterns."""
    import re

    fused = (re.compile(r"^(.*\.self_attn)\.(q|k|v)_proj$"), re.compile(r"^(.*\.experts\.\d+)\.(gate|up)_proj$"))

    def group(module: str):
        for pattern in fused:
            if m := pattern.match(module):
                return m.group(1)
        return None

    start = time.perf_counter()
    for name in names[:calls]:
        target = group(name[:-len(".weight")])
        sorted(n for n in names if n.endswith(".weight") and group(n[:-len(".weight")]) == target)
    return (time.perf_counter() - start) / calls


# Run in children, never here: a child's ru_maxrss starts at its parent's RSS when it forks, so a parent that had
# imported torch and written the checkpoint (~400 MB) made every step below that read as ~400 MB.
TOPOLOGY = """import sys
from build.models.topology import write_topology
write_topology(sys.argv[1], "qwen3-next-80b", seed=0, layers=int(sys.argv[2]), width=int(sys.argv[3]))
"""
# What a quantise process costs before its first shard: Python, torch, numba, compressed-tensors and the compiled
# NVFP4 loops loaded from numba's cache. A copy pays none of it; it does not grow with the checkpoint.
QUANTIZE_START = """import numpy as np
import build.quantize.quantizer
import compressed_tensors.entrypoints.convert.convert_file
from build.quantize import nvfp4
nvfp4.quantize(np.zeros(32, np.uint16), [0], [1], [32], [0], ["warm"])
"""
ROUNDTRIP = """import sys
from pathlib import Path
from safetensors.torch import load_file, save_file
source, out = Path(sys.argv[1]), Path(sys.argv[2])
out.mkdir()
for file in sorted(source.glob("*.safetensors")):
    save_file(load_file(file), out / file.name)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/build-scale"))
    parser.add_argument("--layers", default="2,11,47")
    parser.add_argument("--steps", default=",".join(STEPS), help="a subset of " + ",".join(STEPS))
    parser.add_argument("--width", type=int, default=1, help="multiply the tiny hidden and MLP sizes (memory "
                        "against the bytes of a layer)")
    parser.add_argument("--tasks", type=Path, help="ARC tasks whose prompts calibrate the scales (default: "
                        "$ARC_DATA/arc-agi-2/training)")
    args = parser.parse_args()
    arc_data = Path(os.environ.get("ARC_DATA", REPO.parent / "shared" / "arc-data"))
    tasks = args.tasks or arc_data / "arc-agi-2" / "training"
    if "scales" in args.steps and not tasks.is_dir():
        parser.error(f"{tasks}: no ARC tasks for the scales step (set ARC_DATA or --tasks)")
    steps = [step for step in args.steps.split(",") if step]
    unknown = sorted(set(steps) - set(STEPS))
    if unknown:
        parser.error(f"unknown steps {unknown}")
    from offline_wheels.lock import fetch

    wheels = fetch("cpu-py311") if "bundle" in steps else None
    targets = Targets()
    rows = []
    for layers in map(int, args.layers.split(",")):
        work = args.workdir / f"layers{layers}"
        shutil.rmtree(work, ignore_errors=True)
        subprocess.run([sys.executable, "-c", TOPOLOGY, str(work / "model"), str(layers), str(args.width)],
                       cwd=REPO, check=True, capture_output=True)
        index = json.loads((work / "model" / "model.safetensors.index.json").read_text())["weight_map"]
        vocab = json.loads((work / "model" / "config.json").read_text())["vocab_size"]
        rng = random.Random(0)
        (work / "list.json").write_text(json.dumps({"experts": [sorted(rng.sample(range(512), 384))
                                                                for _ in range(layers)]}))
        (work / "traces.jsonl").write_text("".join(json.dumps({
            "task_id": f"t{i}", "token_ids": [rng.randrange(vocab) for _ in range(62)], "program": [54, 62],
            "segments": {"prompt": [0, 12], "thinking": [12, 52], "answer": [52, 62]}}) + "\n" for i in range(4)))
        (work / "static.toml").write_text(STATIC_RECIPE)
        size = sum(p.stat().st_size for p in (work / "model").glob("*.safetensors"))
        start = time.perf_counter()
        shutil.copytree(work / "model", work / "copy")
        copy_s = time.perf_counter() - start
        start = time.perf_counter()  # every shard loaded and saved again: the per-tensor floor of a converter
        subprocess.run([sys.executable, "-c", ROUNDTRIP, str(work / "model"), str(work / "roundtrip")], cwd=REPO,
                       check=True)
        roundtrip_s = time.perf_counter() - start
        row = {"layers": layers, "tensors": len(index), "bytes": size, "copy_s": copy_s, "roundtrip_s": roundtrip_s,
               "old_lookup_s": old_lookup_seconds(sorted(index)) * len(index)}
        if any(step.startswith("quantize") for step in steps):
            row["quantize_start_s"] = peak_rss([sys.executable, "-c", QUANTIZE_START])[1]
        if wheels is not None:
            start = time.perf_counter()
            shutil.copytree(wheels, work / "wheels-copy")
            row["wheels_copy_s"] = time.perf_counter() - start
        for step, command in commands(work, tasks).items():
            if step not in steps:
                continue
            peak, seconds, _ = peak_rss(command)
            row[step] = (seconds, peak)
            print(f"{layers:3d} layers {len(index):6d} tensors  {step:20s} {seconds:7.1f} s  peak RSS "
                  f"{peak / 1e6:6.0f} MB", flush=True)
        rows.append(row)
        shutil.rmtree(work, ignore_errors=True)
    base = rows[0]
    print("\n| step | " + " | ".join(f"{r['tensors']:,} tensors ({r['tensors'] / base['tensors']:.1f}x)"
                                     for r in rows) + " |")
    print("| --- |" + " --- |" * len(rows))
    print("| plain copy (s) | " + " | ".join(f"{r['copy_s']:.2f}" for r in rows) + " |")
    print("| safetensors load + save of every shard (s) | " + " | ".join(f"{r['roundtrip_s']:.2f}" for r in rows)
          + " |")
    print("| old dependency lookups, extrapolated (s) | " + " | ".join(f"{r['old_lookup_s']:.0f}" for r in rows)
          + " |")
    if wheels is not None:
        print("| plain copy of the checkpoint and the wheels (s) | " + " | ".join(
            f"{r['copy_s'] + r['wheels_copy_s']:.2f}" for r in rows) + " |")
    for step in steps:
        cells = []
        for r in rows:
            seconds, peak = r[step]
            cells.append(f"{seconds:.1f} s, {1000 * seconds / r['tensors']:.2f} s/1k, {peak / 1e6:.0f} MB")
        print(f"| {step} | " + " | ".join(cells) + " |")
    print("\nseconds per 1,000 tensors, largest against smallest (1.0 = linear): " + ", ".join(
        f"{step} {(rows[-1][step][0] / rows[-1]['tensors']) / (base[step][0] / base['tensors']):.2f}"
        for step in steps))
    last = rows[-1]
    if "quantize_start_s" in last:
        print("| quantise process start (imports, compiled loops loaded) (s) | " + " | ".join(
            f"{r['quantize_start_s']:.2f}" for r in rows) + " |")
    for step in [s for s in ("quantize_no_report", "quantize", "prune", "patch") if s in steps]:
        print(f"{step} at {last['tensors']:,} tensors ({last['bytes'] / 1e9:.2f} GB): "
              f"{last[step][0] / last['copy_s']:.1f}x the plain copy, "
              f"{last[step][0] / last['roundtrip_s']:.2f}x the safetensors round trip")
        if step.startswith("quantize"):
            print(f"  less the process start ({last['quantize_start_s']:.1f} s): "
                  f"{(last[step][0] - last['quantize_start_s']) / last['copy_s']:.1f}x the plain copy")
            if args.width > 1 and last["layers"] >= 47:  # issue 17, the whole topology with bytes that count
                targets.at_most(f"{step} (start included) / plain copy at {last['tensors']:,} tensors",
                                last[step][0] / last["copy_s"], 5.0)
    if "bundle" in steps:
        plain = last["copy_s"] + last["wheels_copy_s"]
        print(f"bundle at {last['tensors']:,} tensors: {last['bundle'][0] / plain:.1f}x the plain copy of the "
              "checkpoint and the wheels")
    return targets.exit_code()


if __name__ == "__main__":
    sys.exit(main())
