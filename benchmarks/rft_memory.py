"""Peak memory of one RFT training step (training.rft.train on one row) at several row lengths: the measurement behind
tests/test_rft.py's linearity test (CPU) and .ci/gpu-checks' (GPU).

    python -m benchmarks.rft_memory --lengths 1024 2048 4096 --vocab 32768 [--plain] [--device cuda] \
        [--arch qwen3 --hidden 256 | --arch 27b] [--layers 4] [--extrapolate-to 64] [--set loss_chunk=256 ...]

Prints one JSON line per length (peak in GiB). The step is training/rft.toml's (rank 32, its memory settings)
unless `--set` changes a field; `--plain` turns the memory techniques off (no offload, no chunks: the model's own
loss over full logits, as training ran before them). `--arch 27b` is the study's 27B at its real widths, a few
layers deep; `--extrapolate-to 64` adds what the other layers would (extrapolate).

How it measures. On a GPU: torch.cuda.max_memory_allocated over the step (weights included). On the CPU torch keeps
no allocator statistics, so each length runs in a fresh process whose peak resident set over the step (VmHWM, reset
just before it through /proc/self/clear_refs), minus its resident set before it (imports done), is the step's peak.
glibc's mmap threshold is pinned low (MALLOC_MMAP_THRESHOLD_), so every tensor of more than 64 KiB is its own
mapping, returned to the system when freed: the resident set follows the live tensors, not the allocator's
high-water mark. (getrusage's ru_maxrss would not do: Linux carries it across exec from the forking parent, so a
child of a large test process starts with the parent's peak.) A tiny model's weights are a few MB; what grows is the
activations, the logits and their gradients.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from training.rft import TARGETS as TARGETS_27B

PLAIN = {"offload_activations": False, "mlp_chunk": 0, "loss_chunk": 0}
QWEN3 = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # no linear attention

# Qwen3.5-27B's widths, the study's 27B (they give its 233.5M LoRA parameters; tests/test_rft.py)
WIDTHS_27B = dict(hidden_size=5120, intermediate_size=17408, num_attention_heads=24, num_key_value_heads=4,
                  head_dim=256, linear_num_key_heads=16, linear_num_value_heads=48)


def model_config(arch: str, vocab: int, hidden: int, layers: int):
    """"qwen3": a Qwen3 `hidden` wide (no tokenizer: training reads token ids); "27b": the study's hybrid layout
    (three linear-attention layers, then a full one) at the 27B's widths, `layers` deep."""
    from transformers import Qwen3_5TextConfig, Qwen3Config

    if arch == "27b":
        return Qwen3_5TextConfig(vocab_size=vocab, num_hidden_layers=layers, tie_word_embeddings=False, **WIDTHS_27B)
    return Qwen3Config(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                       num_attention_heads=max(hidden // 64, 1), num_key_value_heads=1, head_dim=64,
                       max_position_embeddings=1 << 17, tie_word_embeddings=False)


def make_base(out: Path, config) -> Path:
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(out)
    return out


def extrapolate(peak: int, config, layers: int, rank: int = 32) -> int:
    """The peak of the same step on the same model `layers` deep: the measured peak plus the other layers' bf16
    weights and their LoRA state (fp32 parameters, gradients and AdamW's two moments: 16 bytes a parameter). What
    else grows with depth, each layer's checkpointed input, waits in host memory (offload). Pure."""
    import torch

    with torch.device("meta"):
        from transformers import AutoModelForCausalLM

        model = AutoModelForCausalLM.from_config(config)
    per_layer = sum(p.numel() for p in model.model.layers.parameters()) / config.num_hidden_layers
    lora = sum(rank * (m.in_features + m.out_features) for name, m in model.model.layers.named_modules()
               if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in TARGETS_27B)
    extra = layers - config.num_hidden_layers
    return int(peak + extra * (2 * per_layer + 16 * lora / config.num_hidden_layers))


def write_row(path: Path, length: int, vocab: int, prompt: int = 64) -> Path:
    from training.dataset import make_row, write_rows

    ids = [(7 * i + 3) % vocab for i in range(length)]
    write_rows([make_row("m", 0, ids[:prompt], ids[prompt:])], path)
    return path


def step(base: str, rows: str, out: str, overrides: dict, device: str) -> int:
    """Train one step on one row; the step's peak bytes (see the module's docstring)."""
    import matplotlib.pyplot  # noqa: F401 - the loss curve's import, before the baseline
    import peft  # noqa: F401
    import torch

    from training.rft import TrainConfig, train

    hybrid = "linear_attention" in json.loads((Path(base) / "config.json").read_text()).get("layer_types", [])
    config = TrainConfig(base=base, rows=rows, out=out, grad_accum=1, targets=TARGETS_27B if hybrid else QWEN3,
                         checkpoint_every=1000, device=device, **overrides)
    if device.startswith("cuda"):
        torch.cuda.reset_peak_memory_stats()
        train(config)
        return torch.cuda.max_memory_allocated()
    Path("/proc/self/clear_refs").write_text("5")  # the peak resident set restarts from the current one
    before = _status("VmHWM")
    train(config)
    return _status("VmHWM") - before


def _status(field: str) -> int:
    """A memory field of /proc/self/status, in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def measure(lengths: list[int], config, overrides: dict, device: str = "cpu") -> dict[int, int]:
    """{length: peak bytes} of one training step per length on a random model of `config` (model_config) (CPU: a
    fresh process each, run side by side: each process's peak is its own)."""
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        base = make_base(work / "base", config)
        jobs = [(length, str(base), str(write_row(work / f"rows-{length}.jsonl", length, config.vocab_size)),
                 str(work / f"run-{length}")) for length in lengths]
        if device.startswith("cuda"):
            return {length: step(base, rows, out, overrides, device) for length, base, rows, out in jobs}
        env = dict(os.environ, MALLOC_MMAP_THRESHOLD_="65536", MALLOC_TRIM_THRESHOLD_="0", OMP_NUM_THREADS="1")
        code = ("import json, sys; from benchmarks.rft_memory import step; "
                "print(step(*sys.argv[1:4], json.loads(sys.argv[4]), 'cpu'))")
        running = {length: subprocess.Popen([sys.executable, "-c", code, base, rows, out, json.dumps(overrides)],
                                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                            cwd=Path(__file__).resolve().parents[1])
                   for length, base, rows, out in jobs}
        peaks = {}
        for length, process in running.items():
            stdout, stderr = process.communicate()
            if process.returncode:
                raise RuntimeError(f"length {length}: the training step failed:\n{stderr[-3000:]}")
            peaks[length] = int(stdout.split()[-1])
        return peaks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.rft_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--lengths", type=int, nargs="+", required=True)
    parser.add_argument("--arch", choices=("qwen3", "27b"), default="qwen3")
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--hidden", type=int, default=256, help="qwen3's width (27b has its own)")
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--extrapolate-to", type=int, default=0, metavar="LAYERS",
                        help="also print the peak the same step would have with this many layers (extrapolate)")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--plain", action="store_true", help="no offload, no chunks (the model's own loss)")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=INT",
                        help="a TrainConfig memory field, e.g. loss_chunk=256")
    args = parser.parse_args(argv)
    overrides = dict(PLAIN) if args.plain else {}
    for item in args.set:
        name, _, value = item.partition("=")
        overrides[name] = int(value)
    config = model_config(args.arch, args.vocab, args.hidden, args.layers)
    for length, peak in measure(args.lengths, config, overrides, args.device).items():
        line = {"arch": args.arch, "layers": args.layers, "length": length, "vocab": args.vocab, "plain": args.plain,
                "peak_gib": round(peak / 2**30, 3)}
        if args.extrapolate_to:
            line[f"extrapolated_gib_at_{args.extrapolate_to}_layers"] = round(
                extrapolate(peak, config, args.extrapolate_to) / 2**30, 2)
        print(json.dumps(line))
    return 0


if __name__ == "__main__":
    sys.exit(main())
