"""Quantisation throughput: build.quantize (streamed, fused groups, compiled NVFP4 loops) against compressed-tensors'
compressor called tensor by tensor and against a plain copy of the same multi-GB checkpoint, in the same run; and the
quantiser's peak memory.

    python benchmarks/quantize_throughput.py [--gb 1.3] [--repeats 3] [--workdir /tmp/quantize-bench]

Both quantisers turn every expert projection to NVFP4 (W4A16) from bf16 in float32. The library baseline loads one
tensor at a time with safetensors, computes its global and block scales with compressed-tensors and calls
`NVFP4PackedCompressor.compress` (its CPU fallbacks); it writes nothing, so the ratio favours it. The copy is
`shutil.copytree` of the checkpoint, warm like the rest. A quantise process first pays a fixed start (Python, torch,
numba, compressed-tensors, the compiled loops loaded from numba's cache), timed alone in each round, so the ratio to
the copy is given with and without it. Run in the build environment.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from build_scale import QUANTIZE_START  # noqa: E402
from prune_and_calibrate import peak_rss  # noqa: E402
from targets import Targets, spread  # noqa: E402

BASELINE = """
import sys, torch
from pathlib import Path
from safetensors import safe_open
from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
from compressed_tensors.quantization import preset_name_to_scheme
from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam
scheme = preset_name_to_scheme("NVFP4A16", ["x"])
for file in sorted(Path(sys.argv[1]).glob("*.safetensors")):
    with safe_open(file, framework="pt") as f:
        for name in f.keys():
            if ".experts." not in name:
                continue
            w = f.get_tensor(name).float()
            g = generate_gparam(w.min().reshape(1), w.max().reshape(1))
            blocks = w.reshape(w.shape[0], -1, 16)
            scale, _ = calculate_qparams(blocks.amin(-1), blocks.amax(-1), scheme.weights, global_scale=g)
            NVFP4PackedCompressor.compress({"weight": w, "weight_scale": scale, "weight_global_scale": g}, scheme)
"""


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=1.3)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/quantize-bench"))
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds of both sides (medians)")
    args = parser.parse_args()
    targets = Targets()
    shutil.rmtree(args.workdir, ignore_errors=True)
    args.workdir.mkdir(parents=True)
    try:
        source = args.workdir / "source"
        largest = int(subprocess.run([sys.executable, str(REPO / "benchmarks" / "prune_and_calibrate.py"), "--write",
                                      str(source), "--gb", str(args.gb)], check=True, capture_output=True,
                                     text=True).stdout.split()[-1])
        total = sum(p.stat().st_size for p in source.glob("*.safetensors"))
        recipe = args.workdir / "experts.toml"
        recipe.write_text('[[rules]]\npattern = \'\\.experts\\.\\d+\\.(gate|up|down)_proj$\'\nscheme = "NVFP4A16"\n')
        shutil.copytree(source, args.workdir / "warm-up")  # both sides read a warm page cache (never dropped)
        shutil.rmtree(args.workdir / "warm-up")
        bases, ours, peaks, copies, starts = [], [], [], [], []
        for _ in range(args.repeats):  # interleaved, so every side sees the same machine state
            bases.append(peak_rss([sys.executable, "-c", BASELINE, str(source)])[1])
            peak, seconds, _ = peak_rss([sys.executable, "-m", "build.quantize", "--model", str(source), "--recipe",
                                         str(recipe), "--out", str(args.workdir / "q")])
            ours.append(seconds)
            peaks.append(peak)
            shutil.rmtree(args.workdir / "q")
            starts.append(peak_rss([sys.executable, "-c", QUANTIZE_START])[1])
            begin = time.perf_counter()
            shutil.copytree(source, args.workdir / "copy")
            copies.append(time.perf_counter() - begin)
            shutil.rmtree(args.workdir / "copy")
        speedups = [b / o for b, o in zip(bases, ours)]
        to_copy = [o / c for o, c in zip(ours, copies)]
        work_to_copy = [(o - s) / c for o, s, c in zip(ours, starts, copies)]
        print(f"checkpoint: {total / 1e9:.2f} GB bf16, largest shard {largest / 1e6:.0f} MB; "
              f"{args.repeats} interleaved rounds, warm; medians (min-max)")
        print(f"compressed-tensors tensor by tensor (no writing): {spread([total / b / 1e6 for b in bases])} MB/s")
        print(f"build.quantize (streamed, written):               {spread([total / o / 1e6 for o in ours])} MB/s "
              f"({spread(ours)} s); peak RSS {max(peaks) / 1e6:.0f} MB")
        print(f"plain copy:                                       {spread([total / c / 1e6 for c in copies])} MB/s "
              f"({spread(copies)} s)")
        print(f"quantise process start (imports, loops loaded):   {spread(starts)} s")
        print(f"build.quantize against the library: {spread(speedups)}x faster")
        print(f"build.quantize against the copy: {spread(to_copy)}x its time; less the start: {spread(work_to_copy)}x")
        # whole processes, each with its imports: ours pays numba's too
        targets.at_least("build.quantize speed / compressed-tensors' (median)", statistics.median(speedups), 2.0)
    finally:
        shutil.rmtree(args.workdir, ignore_errors=True)
    return targets.exit_code()


if __name__ == "__main__":
    sys.exit(main())
