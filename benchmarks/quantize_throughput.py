"""Quantisation throughput: build.quantize (streamed, fused groups) against compressed-tensors' compressor called
tensor by tensor, on the same multi-GB checkpoint in the same run; and the quantiser's peak memory.

    python benchmarks/quantize_throughput.py [--gb 1.3] [--workdir /tmp/quantize-bench]

Both quantise every expert projection to NVFP4 (W4A16) from bf16, upcasting to fp32 first. The baseline loads one
tensor at a time with safetensors, computes its global and block scales with compressed-tensors and calls
`NVFP4PackedCompressor.compress`; it writes nothing, so the ratio favours it. Run in the build environment.
"""

from __future__ import annotations

import argparse
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from prune_and_calibrate import drop_caches, peak_rss  # noqa: E402

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gb", type=float, default=1.3)
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/quantize-bench"))
    args = parser.parse_args()
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
        drop_caches()
        _, base_s, _ = peak_rss([sys.executable, "-c", BASELINE, str(source)])
        drop_caches()
        peak, ours_s, _ = peak_rss([sys.executable, "-m", "build.quantize", "--model", str(source), "--recipe",
                                    str(recipe), "--out", str(args.workdir / "q")])
        print(f"checkpoint: {total / 1e9:.2f} GB bf16, largest shard {largest / 1e6:.0f} MB")
        print(f"compressed-tensors tensor by tensor (no writing): {total / base_s / 1e6:.1f} MB/s")
        print(f"build.quantize (streamed, written):               {total / ours_s / 1e6:.1f} MB/s "
              f"(ratio {base_s / ours_s:.2f}); peak RSS {peak / 1e6:.0f} MB")
    finally:
        shutil.rmtree(args.workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
