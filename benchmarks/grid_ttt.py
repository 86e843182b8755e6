"""The kit's per-task TTT step (issue 29) against the naive baseline a team would write, on one grid model, one task,
the same sequences and the same number of steps: step time and peak memory.

    python benchmarks/grid_ttt.py [--profile grid-tiny] [--device cpu] [--steps N] [--repeats 5]
    python benchmarks/grid_ttt.py --profile grid-4b-4xL4 --device cuda --width 4b --layers 4 --task b5ca7ac4 \
        --steps 16 --max-len 8192   # the GPU check (.ci/gpu-checks)

Variants, each in a fresh process every round (so that each has its own peak memory), the order reversed
every other round, `--repeats` rounds:

    kit     submission.grid.ttt.Adapter: adapters and AdamW state in the model's dtype (`autocast_adapter_dtype=False`),
            gradient checkpointing only when the longest sequence would not fit (never on a CPU; logged), batch 1
            with no padding, as the kit trains (SPEC section 10: batch 1, no packing)
    naive   PEFT's defaults: `get_peft_model` (adapters upcast to float32, so float32 AdamW state too), gradient
            checkpointing always on (`gradient_checkpointing_enable()` as a team calls it), a plain training loop
            with the same AdamW, cosine schedule and clipping; batches padded to the longest, which at the study's
            batch of 1 pads nothing

The LoRA shape, learning rate and dtype are the profile's (`--profile`; `--dtype` overrides); the model is
build.models.tiny's Qwen3 cut by build.models.grid_vocab at its tiny widths, or at Qwen3-4B's (`--width 4b`: hidden
2,560, MLP 9,728, 32 query and 8 key-value heads of 128) with `--layers` layers; the task is ARC-AGI-2 evaluation's
shortest (`--task` another), its sequences `training_sequences`' first `--steps` (default the profile's ttt.sequences).
A step's time is a variant's training time over its steps, its set-up (wrapping, the optimiser) included; before
it, one untimed forward and backward pass of the base pays the device's first-call costs for both.
Peak memory is what training adds to the loaded base: on a GPU `torch.cuda.max_memory_allocated` less what was
allocated before the adapter; on a CPU the process's peak resident set (VmHWM, reset through /proc/self/clear_refs
after loading) less its resident set then. Ratios are against the baseline measured in the same run.

Target: the kit's step at least as fast as the naive one (median ratio of the rounds) on a CPU, where the base is
the profile's float32 (adapters float32 on both sides: only checkpointing differs); on a GPU in bfloat16 >= 1.4x,
the issue's expectation from not upcasting (PEFT's float32 adapters take the L4's float32 path). Memory is reported,
not a target: the kit spends free memory on activations to skip the recomputation, which is its choice.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
from targets import Targets, spread  # noqa: E402

ARC = Path(os.environ.get("ARC_DATA", Path(__file__).resolve().parents[2] / "shared" / "arc-data"))
VARIANTS = ("kit", "naive")
# Qwen3-4B's widths (its config.json), for the GPU variant; the layer count is --layers.
WIDTHS = {"tiny": {}, "4b": dict(hidden_size=2560, intermediate_size=9728, num_attention_heads=32,
                                 num_key_value_heads=8, head_dim=128),
          # Qwen3-4B's attention layout on a narrow residual stream: long contexts on a CPU (grid_search --lockstep)
          "4b-heads": dict(hidden_size=256, intermediate_size=512, num_attention_heads=32, num_key_value_heads=8,
                           head_dim=128)}
TARGET = {"cpu": 1.0, "cuda": 1.4}  # kit / naive step-time ratio, median of the rounds (module docstring)
FIELDS = ("variant", "steps", "step_s", "tokens", "peak_mib", "adapter_dtype", "checkpointing", "loss_first",
          "loss_last")


def grid_checkpoint(root: Path, width: str = "tiny", layers: int = 2, seed: int = 3) -> Path:
    """build.models.tiny's Qwen3 at `width` with `layers` layers, cut to the grid vocabulary (shared with
    grid_search.py)."""
    from build.models.grid_vocab import cut
    from build.models.tiny import make_checkpoint

    # the config's per-layer list follows the count (transformers validates it on save)
    widths = {**WIDTHS[width], "num_hidden_layers": layers, "layer_types": ["full_attention"] * layers}
    return cut(make_checkpoint(root / "base", "qwen3", seed=seed, widths=widths), root / "grid")


def _rss_bytes(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


class PeakMemory:
    """What a block adds to the memory in use at its start, at its peak (module docstring)."""

    def __init__(self, device: str):
        import torch

        self.torch, self.cuda = torch, device.startswith("cuda")

    def __enter__(self):
        if self.cuda:
            self.torch.cuda.synchronize()
            self.torch.cuda.reset_peak_memory_stats()
            self.before = self.torch.cuda.memory_allocated()
        else:
            Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current resident set (Linux >= 4.0)
            self.before = _rss_bytes("VmRSS")
        return self

    def __exit__(self, *exc) -> None:
        if self.cuda:
            self.torch.cuda.synchronize()
            self.added = self.torch.cuda.max_memory_allocated() - self.before
        else:
            self.added = _rss_bytes("VmHWM") - self.before


def naive_train(base, config, sequences) -> tuple[list[float], bool]:
    """The baseline (module docstring): PEFT's defaults and a plain loop. Returns the losses and the checkpointing."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import get_cosine_schedule_with_warmup

    lora = LoraConfig(r=config.rank, lora_alpha=config.alpha, use_rslora=config.rslora, lora_dropout=0.0,
                      target_modules=list(config.targets), modules_to_save=list(config.full) or None,
                      task_type="CAUSAL_LM")
    model = get_peft_model(base, lora)  # autocast_adapter_dtype=True by default: float32 adapters
    model.gradient_checkpointing_enable()
    model.train()
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    optimiser = torch.optim.AdamW(params, lr=config.lr, weight_decay=0.0)
    schedule = get_cosine_schedule_with_warmup(optimiser, math.ceil(config.warmup * len(sequences)), len(sequences))
    losses = []
    for encoded in sequences:  # a batch of one: padding to the longest pads nothing
        ids = torch.tensor([encoded.ids], device=device)
        labels = ids.masked_fill(~torch.tensor([encoded.output_mask], device=device), -100)
        loss = model(input_ids=ids, attention_mask=torch.ones_like(ids), labels=labels).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, config.clip)
        optimiser.step()
        schedule.step()
        optimiser.zero_grad(set_to_none=True)
        losses.append(float(loss.detach()))
    return losses, model.is_gradient_checkpointing


def adapter_dtype(model) -> str:
    from peft.tuners.lora import LoraLayer

    layer = next(m for m in model.modules() if isinstance(m, LoraLayer))
    return str(next(iter(layer.lora_A.values())).weight.dtype).removeprefix("torch.")


def warm_up(base, encoded) -> None:
    """One forward and backward pass of the base, untimed, so that neither variant's first step pays the device's
    first-call costs (on a GPU: the cuBLAS handles, kernel selection)."""
    import torch

    ids = torch.tensor([encoded.ids], device=base.device)
    base(input_ids=ids, labels=ids).loss.backward()
    base.zero_grad(set_to_none=True)


def worker(args) -> dict:
    """One variant's training in this process: its record (FIELDS)."""
    import torch

    from submission.grid.model import load_model
    from submission.grid.ttt import Adapter, training_sequences
    from submission.profiles import load_grid_profile
    from submission.tasks import load_tasks

    torch.set_num_threads(args.threads)
    profile = load_grid_profile(args.profile)
    config = profile.ttt
    tasks = load_tasks(ARC / "arc-agi-2" / "evaluation").tasks
    task = find_task(tasks, args.task)
    sequences = training_sequences(task, config, args.max_len)[:args.steps]
    base = load_model(args.model, args.dtype or profile.model.dtype, args.device)
    warm_up(base, sequences[0])
    torch.manual_seed(0)  # the same LoRA initialisation on both sides
    with PeakMemory(args.device) as peak:
        t = time.perf_counter()
        if args.worker == "kit":
            adapter = Adapter(base, config, log=lambda line: print(line, file=sys.stderr))
            report = adapter.train(sequences, clock=time.perf_counter)
            losses, checkpointing, model = list(report.losses), report.checkpointing, adapter.model
        else:
            (losses, checkpointing), model = naive_train(base, config, sequences), base
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - t
    return dict(variant=args.worker, steps=len(losses), step_s=seconds / len(losses),
                tokens=sum(len(s.ids) for s in sequences), peak_mib=peak.added / 2**20,
                adapter_dtype=adapter_dtype(model), checkpointing=checkpointing, loss_first=losses[0],
                loss_last=losses[-1])


def find_task(tasks, task_id: str):
    for task in tasks:
        if task.id == task_id:
            return task
    raise SystemExit(f"--task {task_id}: no such task in {ARC / 'arc-agi-2' / 'evaluation'}")


def run_variant(name: str, args, model_dir: Path, task_id: str) -> dict:
    command = [sys.executable, __file__, "--worker", name, "--model", str(model_dir), "--task", task_id,
               "--profile", args.profile, "--device", args.device, "--steps", str(args.steps),
               "--threads", str(args.threads), "--max-len", str(args.max_len)] + (
        ["--dtype", args.dtype] if args.dtype else [])
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        raise RuntimeError(f"the {name} variant failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--profile", default="grid-tiny", help="grid profile: its ttt section and model dtype")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="", help="overrides the profile's model.dtype")
    parser.add_argument("--width", default="tiny", choices=sorted(WIDTHS))
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--task", default="", help="an ARC-AGI-2 evaluation task id (default: the shortest)")
    parser.add_argument("--steps", type=int, default=0, help="TTT steps (default: the profile's ttt.sequences)")
    parser.add_argument("--max-len", type=int, default=4096, help="context the sequences are cut to")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per variant")
    parser.add_argument("--worker", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        print(json.dumps(worker(args)))
        return 0

    from submission.grid.queue import task_cost
    from submission.profiles import load_grid_profile
    from submission.tasks import load_tasks

    profile = load_grid_profile(args.profile)
    args.steps = args.steps or profile.ttt.sequences
    tasks = load_tasks(ARC / "arc-agi-2" / "evaluation").tasks
    task = find_task(tasks, args.task) if args.task else min(tasks, key=task_cost)
    print(f"task {task.id}, {args.steps} steps; profile {args.profile} (LoRA rank {profile.ttt.rank}), "
          f"{args.dtype or profile.model.dtype} on {args.device}, width {args.width}, {args.layers} layers; "
          f"{args.repeats} interleaved rounds, medians (min-max)")
    records: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="grid-ttt-bench-") as root:
        model_dir = grid_checkpoint(Path(root), args.width, args.layers)
        for round_ in range(args.repeats):
            for name in VARIANTS if round_ % 2 == 0 else VARIANTS[::-1]:
                records[name].append(run_variant(name, args, model_dir, task.id))
    for name, runs in records.items():
        one = runs[0]
        print(f"  {name:6s} {spread([r['step_s'] * 1e3 for r in runs])} ms/step, "
              f"{spread([one['tokens'] / one['steps'] / r['step_s'] for r in runs])} tok/s, peak "
              f"{spread([r['peak_mib'] for r in runs])} MiB; adapters {one['adapter_dtype']}, checkpointing "
              f"{'on' if one['checkpointing'] else 'off'}, loss {one['loss_first']:.4f} -> {one['loss_last']:.4f}")
        print(json.dumps(one))
    time_ratios = [n["step_s"] / k["step_s"] for k, n in zip(records["kit"], records["naive"])]
    memory_ratios = [n["peak_mib"] / max(k["peak_mib"], 1e-9) for k, n in zip(records["kit"], records["naive"])]
    print(f"kit against naive: step time {spread(time_ratios)}x faster, peak memory {spread(memory_ratios)}x "
          f"smaller (naive / kit)")
    targets = Targets()
    targets.at_least("kit / naive TTT step, time (median)", statistics.median(time_ratios),
                     TARGET["cuda" if args.device.startswith("cuda") else "cpu"])
    return targets.exit_code()


if __name__ == "__main__":
    sys.exit(main())
