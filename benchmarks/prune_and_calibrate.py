"""Expert pruning memory and speed on a multi-GB checkpoint, and the cost of the calibration hooks.

    python benchmarks/prune_and_calibrate.py [--gb 2.5] [--workdir /tmp/prune-bench]

1. Writes a Qwen3-MoE-shaped checkpoint of about `--gb` GB in 500 MB shards (random bf16 tensors with the real
   names and config; no model is instantiated), prunes it to 3/4 of its experts with `build.prune` in a subprocess,
   and reports the subprocess's peak resident memory against the largest shard, and its throughput against a plain
   copy of the same files, both warm (the page cache is never dropped), interleaved over `--repeats` rounds.
2. Runs a tiny Qwen3-MoE over calibration traces with and without the `build.prune.calibrate` hooks and reports tokens/s
   and the overhead ratio.
Run it in the build environment (make build-env).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from targets import Targets, spread  # noqa: E402

LAYERS, EXPERTS, TOP_K = 8, 128, 8
HIDDEN, INTER = 1024, 512


def write_checkpoint(folder: Path, gb: float) -> int:
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    per_expert = 3 * HIDDEN * INTER * 2  # bytes, bf16
    layers = max(int(gb * 1e9 / (EXPERTS * per_expert)), 1)
    config = {"architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "num_hidden_layers": layers,
              "hidden_size": HIDDEN, "moe_intermediate_size": INTER, "num_local_experts": EXPERTS,
              "num_experts_per_tok": TOP_K, "vocab_size": 1024, "intermediate_size": 2048,
              "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 128}
    (folder / "config.json").write_text(json.dumps(config))
    weight_map, shard, size, number, largest = {}, {}, 0, 0, 0

    def flush():
        nonlocal shard, size, number, largest
        if shard:
            name = f"model-{number:05d}.safetensors"
            save_file(shard, folder / name)
            weight_map.update({k: name for k in shard})
            largest = max(largest, (folder / name).stat().st_size)
            shard, size, number = {}, 0, number + 1

    g = torch.Generator().manual_seed(0)
    for layer in range(layers):
        shard[f"model.layers.{layer}.mlp.gate.weight"] = torch.randn(EXPERTS, HIDDEN, generator=g).bfloat16()
        for e in range(EXPERTS):
            prefix = f"model.layers.{layer}.mlp.experts.{e}"
            shard[f"{prefix}.gate_proj.weight"] = torch.randn(INTER, HIDDEN, generator=g).bfloat16()
            shard[f"{prefix}.up_proj.weight"] = torch.randn(INTER, HIDDEN, generator=g).bfloat16()
            shard[f"{prefix}.down_proj.weight"] = torch.randn(HIDDEN, INTER, generator=g).bfloat16()
            size += per_expert
            if size >= 500e6:
                flush()
    flush()
    total = sum(p.stat().st_size for p in folder.glob("*.safetensors"))
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                     "weight_map": weight_map}))
    return largest


def peak_rss(cmd: list[str]) -> tuple[int, float, str]:
    """Peak resident bytes of one child process (its own rusage, not the max over all children), its seconds and
    its output."""
    start = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    output = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise RuntimeError(f"{cmd[:4]} failed with status {status}")
    proc.returncode = 0
    proc.stdout.close()
    return usage.ru_maxrss * 1024, time.perf_counter() - start, output  # ru_maxrss is in kB on Linux


def prune_benchmark(workdir: Path, gb: float, repeats: int, targets: Targets) -> None:
    source = workdir / "source"
    # written by a child process: the children measured below inherit no large parent (fork counts its pages)
    largest = int(subprocess.run([sys.executable, __file__, "--write", str(source), "--gb", str(gb)], check=True,
                                 capture_output=True, text=True).stdout.split()[-1])
    total = sum(p.stat().st_size for p in source.glob("*.safetensors"))
    layers = json.loads((source / "config.json").read_text())["num_hidden_layers"]
    rng = random.Random(0)
    keep = EXPERTS * 3 // 4
    (workdir / "list.json").write_text(json.dumps({"name": "bench",
                                                   "experts": [sorted(rng.sample(range(EXPERTS), keep))
                                                               for _ in range(layers)]}))
    imports, _, _ = peak_rss([sys.executable, "-c", "import numpy, safetensors, build.prune, "
                              "submission.progress"])  # the interpreter and the libraries build.prune uses
    shutil.copytree(source, workdir / "warm-up")  # both sides read from a warm page cache (never dropped: as root
    shutil.rmtree(workdir / "warm-up")             # that measures the disk and disturbs the whole machine)
    copies, works, peaks = [], [], []
    for _ in range(repeats):  # interleaved, so both sides see the same machine state
        start = time.perf_counter()
        shutil.copytree(source, workdir / "copy")
        copies.append(time.perf_counter() - start)
        shutil.rmtree(workdir / "copy")
        peak, _, output = peak_rss([sys.executable, "-m", "build.prune", "--model", str(source), "--list",
                                    str(workdir / "list.json"), "--out", str(workdir / "pruned")])
        works.append(float(output.split("pruned in ")[1].split(" s")[0]))
        peaks.append(peak)
        shutil.rmtree(workdir / "pruned")
    ratios = [c / w for c, w in zip(copies, works)]
    print(f"checkpoint: {total / 1e9:.2f} GB in {len(list(source.glob('*.safetensors')))} shards, largest shard "
          f"{largest / 1e6:.0f} MB; pruned {EXPERTS} -> {keep} experts per layer; {repeats} interleaved rounds, warm")
    peak = max(peaks)
    print(f"prune peak RSS: {peak / 1e6:.0f} MB = largest shard {largest / 1e6:.0f} MB + libraries "
          f"{imports / 1e6:.0f} MB + {(peak - largest - imports) / 1e6:.0f} MB working set")
    print(f"plain copy: {spread([total / c / 1e6 for c in copies])} MB/s; prune: "
          f"{spread([total / w / 1e6 for w in works])} MB/s; ratio {spread(ratios)}")
    targets.at_least("prune throughput / plain copy (median)", statistics.median(ratios), 0.5)
    # memory follows the largest shard, not the checkpoint: shard + libraries + a working set of at most a shard
    targets.at_most("prune peak RSS", peak / 1e6, (2 * largest + imports) / 1e6, " MB")


def calibration_benchmark(workdir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    from build.models.tiny import make_checkpoint
    from build.prune.calibrate import Recorder

    folder = make_checkpoint(workdir / "tiny-moe", "qwen3_moe", seed=0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, 2048), generator=torch.Generator().manual_seed(0))

    def tokens_per_second(repeats: int = 4) -> float:
        with torch.no_grad():
            model(ids)
            start = time.perf_counter()
            for _ in range(repeats):
                model(ids)
        return repeats * ids.shape[1] / (time.perf_counter() - start)

    plain, hooked = [], []
    for _ in range(5):  # alternate, and take medians: this machine is noisy
        plain.append(tokens_per_second())
        recorder = Recorder(model)
        hooked.append(tokens_per_second())
        recorder.remove()
    p, h = sorted(plain)[2], sorted(hooked)[2]
    print(f"calibration forward: {p:.0f} tokens/s plain, {h:.0f} with hooks (medians of 5); overhead x{p / h:.2f}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=2.5)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds of copy and prune (medians)")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/prune-bench"))
    parser.add_argument("--write", type=Path, help=argparse.SUPPRESS)  # internal: write the checkpoint only
    args = parser.parse_args()
    if args.write:
        print(write_checkpoint(args.write, args.gb))
        return 0
    targets = Targets()
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    try:
        prune_benchmark(args.workdir, args.gb, args.repeats, targets)
        calibration_benchmark(args.workdir)
    finally:
        shutil.rmtree(args.workdir, ignore_errors=True)
    return targets.exit_code()


if __name__ == "__main__":
    sys.exit(main())
