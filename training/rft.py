"""Rejection-sampling fine-tuning: a LoRA on the model's own verified traces, then merged into the base.

    python -m training.rft --config training/rft.toml          # train (resumes from its last checkpoint)
    python -m training.rft --config training/rft.toml --merge  # merge the adapter, patch, optionally quantise

Rows come from training.dataset (prompt ids exactly as at inference, masked; completion supervised: RFT v1's thinking
+ grid by default). training/rft.toml is the study's RFT v1 recipe (SPEC section 9, seed ~1966-1971, ~4428-4441), the
defaults here: LoRA rank 32, alpha 32, dropout 0, on the attention q/k/v/o, the linear-attention in/out projections
and the MLP gate/up/down (`targets`, the study's twelve names; Qwen3-Next's fused pairs are mapped (FUSED); each must
name a Linear module of the model, or training refuses to start, so a name that does not fit the architecture is never
skipped in silence); AdamW lr 1e-4 with no weight decay, 5% warm-up, cosine, clip 1.0, one epoch, micro-batch 1, no
packing (packing leaks linear-attention state), gradient accumulation 8, bfloat16 on a GPU, and the study's memory
techniques for 81,920-token rows (training.memory: re-entrant gradient checkpointing, activations offloaded to host
memory, MLPs over 8,192 positions at a time, cross-entropy over 2,048). The loss is the token mean over the
supervised tokens of an optimiser step's rows (a long trace weighs by its tokens, not as one row); rows longer than
`max_length` (81,920) are dropped, counted and reported (stderr and `data.json`). The merge re-quantises with the
recipe and, by default, recomputes the FP8 KV-cache scales on `calibration_tasks`. Plain PEFT + torch: the loop is
short; `backend = "unsloth"` runs the same loop on unsloth's model and LoRA (the fast path on a GPU; its own
environment, `make unsloth-env`, since it pins older transformers and trl). Progress on stderr, a loss curve PNG,
checkpoints (adapter + optimiser + step) that resume.
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from dataclasses import dataclass
from pathlib import Path

from build.pipeline import chain
from submission import strict_toml
from submission.progress import ProgressLine
from training.corpus.mix import CorpusMix
from training.dataset import read_rows
from training.memory import chunk_mlps, memory_plan, row_loss

# The study's twelve projection types (seed ~1966-1971, ~4428: 496 modules of the hybrid 27B, 16 full-attention and
# 48 linear-attention layers: 16 x 4 + 48 x 5 + 64 x 3), named as in transformers' Qwen3.5 layers. Qwen3-Next fuses
# two pairs of them (FUSED); another architecture lists its own.
TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj",
           "gate_proj", "up_proj", "down_proj")
# a fused Linear and the study's projections it holds: adapting it adapts both, so both must be targeted
FUSED = {"in_proj_qkvz": ("in_proj_qkv", "in_proj_z"), "in_proj_ba": ("in_proj_b", "in_proj_a")}


@dataclass(frozen=True)
class TrainConfig:
    base: str  # the checkpoint to adapt
    rows: str  # training rows (training.dataset JSONL)
    out: str  # adapter, checkpoints, loss curve, merged model
    rank: int = 32
    alpha: int = 32
    dropout: float = 0.0
    lr: float = 1e-4
    weight_decay: float = 0.0  # SPEC 9: AdamW with no weight decay (torch's default would be 0.01)
    warmup: float = 0.05
    clip: float = 1.0
    epochs: int = 1
    grad_accum: int = 8
    max_length: int = 81_920  # longer rows are dropped and counted
    targets: tuple[str, ...] = TARGETS  # LoRA target module names; every one must exist in the model
    gradient_checkpointing: bool = True  # re-entrant, as the study's (seed ~4436)
    offload_activations: bool = True  # what checkpointing saves waits in host memory (training.memory)
    mlp_chunk: int = 8_192  # positions per MLP slice (0 = whole rows); seed ~4437
    loss_chunk: int = 2_048  # positions per cross-entropy slice (0 = the model's loss over full logits); seed ~4438
    checkpoint_every: int = 50  # optimiser steps
    seed: int = 0
    dtype: str = "auto"  # "auto" = bfloat16 on a GPU, float32 on the CPU; or a torch dtype name
    recipe: str = ""  # build/ quantisation recipe applied after merging ("" = none)
    calibration_tasks: str = ""  # ARC tasks whose prompts recompute the KV-cache (and static input) scales
    kv_scales: bool = True  # with a recipe: recompute the FP8 KV-cache scales after re-quantising (needs tasks)
    backend: str = "peft"  # "peft" (plain PEFT) or "unsloth" (its own environment: make unsloth-env)
    device: str = "auto"  # "auto" = the first CUDA GPU if there is one, else the CPU; or "cpu", "cuda:1", ...
    # the [corpus] table: the synthetic-task mix `training.traces --config` samples the rows' traces from
    # (training/corpus/mix.py); training itself only records it
    corpus: CorpusMix = CorpusMix()

    def __post_init__(self) -> None:
        if self.backend not in ("peft", "unsloth"):
            raise ValueError(f"backend must be peft or unsloth, not {self.backend!r}")
        if self.dtype not in ("auto", "bfloat16", "float16", "float32"):
            raise ValueError(f"dtype must be auto, bfloat16, float16 or float32, not {self.dtype!r}")
        for name in ("mlp_chunk", "loss_chunk"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 0:
                raise ValueError(f"{name} must be a whole number of positions >= 0 (0 = no chunking), not "
                                 f"{getattr(self, name)!r}")
        if self.recipe and self.kv_scales and not self.calibration_tasks:
            raise ValueError("recipe: re-quantising recomputes the KV-cache scales on calibration_tasks; set them, or "
                             "kv_scales = false to keep none")


def load_config(path: str | Path) -> TrainConfig:
    """The training config of a TOML file (submission.strict_toml): a missing file, invalid TOML, an unknown key, a
    value of the wrong type or a bad setting raise TomlError naming the file and the key (`[corpus]` keys as
    `FILE.corpus.KEY`)."""
    return strict_toml.build(TrainConfig, strict_toml.read(path), str(path))


def target_modules(model, targets: tuple[str, ...] = TARGETS) -> list[str]:
    """`targets` as the model's Linear module names (training.rft.resolve_targets): one that matches nothing is
    refused."""
    import torch

    return resolve_targets(targets, {name.rsplit(".", 1)[-1] for name, m in model.named_modules()
                                     if isinstance(m, torch.nn.Linear)})


def resolve_targets(targets: tuple[str, ...], present: set[str]) -> list[str]:
    """The module names PEFT adapts for `targets` on a model whose Linear layers are named `present`: each target
    as it is, or, where the model fuses it with its partner (FUSED), the fused layer, once. Refused: a target that
    matches nothing, and half of a fused pair (adapting the fused layer would adapt the other half too). Pure."""
    fused_of = {part: fused for fused, parts in FUSED.items() if fused in present for part in parts}
    resolved, missing = [], []
    for target in targets:
        name = target if target in present else fused_of.get(target)
        if name is None:
            missing.append(target)
        elif name != target and not set(FUSED[name]) <= set(targets):
            raise ValueError(f"LoRA target {target}: the model fuses it with {' and '.join(FUSED[name])} as {name}; "
                             f"target all of them or {name}")
        elif name not in resolved:
            resolved.append(name)
    if missing:
        raise ValueError(f"LoRA target(s) {', '.join(missing)} match no Linear module of the model (its Linear "
                         f"names: {', '.join(sorted(present))}); set targets in the training config")
    return resolved


def within_length(rows: list, max_length: int) -> tuple[list, int]:
    """The rows of at most `max_length` tokens, and how many were longer. Pure."""
    kept = [r for r in rows if len(r.input_ids) <= max_length]
    return kept, len(rows) - len(kept)


def token_weights(rows: list) -> list[float]:
    """Per row of one optimiser step, its share of the step's supervised tokens: the rows' mean losses weighted so
    the step's loss is the token mean over all of them. A label is predicted from the token before it, so the first
    position never counts. Pure."""
    counts = [sum(1 for label in r.labels[1:] if label != -100) for r in rows]
    total = sum(counts)
    if not total:
        raise ValueError("no supervised tokens in the step's rows")
    return [c / total for c in counts]


def resolve_dtype(requested: str, device: str) -> str:
    """"auto": bfloat16 on a GPU (as the study trained), float32 on the CPU (bf16 matmuls there are slow and
    coarse). Pure."""
    if requested != "auto":
        return requested
    return "bfloat16" if device.startswith("cuda") else "float32"


def resolve_device(requested: str) -> str:
    import torch

    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {requested!r}: no CUDA GPU is visible")
    return requested


def schedule(step: int, total: int, warmup: float) -> float:
    """Learning-rate multiplier: linear warm-up, then cosine to zero. Pure."""
    warm = max(int(round(warmup * total)), 1)
    if step < warm:
        return (step + 1) / warm
    return 0.5 * (1 + math.cos(math.pi * (step - warm) / max(total - warm, 1)))


def train(config: TrainConfig, progress=None) -> list[float]:
    if config.backend == "unsloth":
        import unsloth  # noqa: F401 - unsloth patches transformers and must come first
    import torch
    from peft import LoraConfig, PeftModel, get_peft_model
    from transformers import AutoModelForCausalLM

    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    rows, dropped = within_length(read_rows(config.rows), config.max_length)
    print(f"{len(rows)} rows; {dropped} dropped as longer than max_length {config.max_length}", file=sys.stderr)
    (out / "data.json").write_text(json.dumps({"rows": len(rows), "dropped_over_max_length": dropped,
                                               "max_length": config.max_length}))
    if not rows:
        raise ValueError(f"{config.rows}: no rows within max_length {config.max_length}")
    torch.manual_seed(config.seed)
    device = resolve_device(config.device)
    checkpoint = out / "checkpoint"
    resume = (checkpoint / "state.pt").exists()
    dtype = getattr(torch, resolve_dtype(config.dtype, device))
    plan = memory_plan(config.gradient_checkpointing, config.offload_activations, config.mlp_chunk, config.loss_chunk,
                       config.backend, device)
    if config.backend == "unsloth":
        model = _unsloth_model(config, resume, checkpoint, device, dtype)
    else:
        model = AutoModelForCausalLM.from_pretrained(config.base, dtype=dtype).to(device)
        if config.gradient_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": plan.reentrant})
            model.enable_input_require_grads()
        if resume:
            model = PeftModel.from_pretrained(model, checkpoint, is_trainable=True)
        else:
            model = get_peft_model(model, LoraConfig(r=config.rank, lora_alpha=config.alpha,
                                                     lora_dropout=config.dropout,
                                                     target_modules=target_modules(model, config.targets),
                                                     task_type="CAUSAL_LM"))
    if plan.mlp_chunk:
        chunk_mlps(model, plan.mlp_chunk)
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr,
                                  weight_decay=config.weight_decay)
    order = [i for _ in range(config.epochs) for i in random.Random(config.seed).sample(range(len(rows)), len(rows))]
    total = math.ceil(len(order) / config.grad_accum)
    step, losses = 0, []
    if (checkpoint / "state.pt").exists():
        state = torch.load(checkpoint / "state.pt", weights_only=False, map_location=device)
        optimizer.load_state_dict(state["optimizer"])
        step, losses = state["step"], state["losses"]
    model.train()
    for step in range(step, total):
        for group in optimizer.param_groups:
            group["lr"] = config.lr * schedule(step, total, config.warmup)
        batch = order[step * config.grad_accum:(step + 1) * config.grad_accum]
        running = 0.0
        weights = token_weights([rows[i] for i in batch])
        for index, weight in zip(batch, weights):  # micro-batch 1, no packing; the row's mean loss, token-weighted
            row = rows[index]
            loss = row_loss(model, torch.tensor([row.input_ids], device=device),
                            torch.tensor([row.labels], device=device), plan)
            (loss * weight).backward()
            running += loss.item() * weight
        torch.nn.utils.clip_grad_norm_([p for p in model.parameters() if p.requires_grad], config.clip)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(running)
        if progress:
            progress(step + 1, total, running)
        if (step + 1) % config.checkpoint_every == 0 or step + 1 == total:
            model.save_pretrained(checkpoint)
            torch.save({"optimizer": optimizer.state_dict(), "step": step + 1, "losses": losses},
                       checkpoint / "state.pt")
    model.save_pretrained(out / "adapter")
    loss_curve(losses, out / "loss.png")
    (out / "losses.json").write_text(json.dumps(losses))
    return losses


def _unsloth_model(config: TrainConfig, resume: bool, checkpoint: Path, device: str, dtype):
    """The same LoRA through unsloth (its kernels and gradient checkpointing, which offloads to host memory itself),
    from the same config."""
    from unsloth import FastLanguageModel

    gc = "unsloth" if config.gradient_checkpointing else False
    model, _ = FastLanguageModel.from_pretrained(model_name=config.base, max_seq_length=config.max_length,
                                                 dtype=dtype, load_in_4bit=False,
                                                 use_gradient_checkpointing=gc, device_map=device)
    if resume:
        from peft import PeftModel

        return PeftModel.from_pretrained(model, checkpoint, is_trainable=True)
    return FastLanguageModel.get_peft_model(model, r=config.rank, lora_alpha=config.alpha, lora_dropout=config.dropout,
                                            target_modules=target_modules(model, config.targets),
                                            use_gradient_checkpointing=gc,
                                            random_state=config.seed)


def loss_curve(losses: list[float], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from matplotlib.ticker import MaxNLocator

    fig, ax = plt.subplots(figsize=(7, 3.5))
    ax.plot(range(1, len(losses) + 1), losses, marker="." if len(losses) <= 50 else None)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # steps are whole
    ax.set_xlabel("optimiser step")
    ax.set_ylabel("loss (completion tokens)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def merge(config: TrainConfig) -> Path:
    """The adapter merged into the base and saved as safetensors (the base's dtype), then build.pipeline's chain: the
    end-of-turn patch (unless the base records it) and the recipe's quantisation, its scales recomputed on the
    merged weights: a checkpoint build.bundle can take."""
    import shutil

    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(config.out)
    base_config = json.loads((Path(config.base) / "config.json").read_text())
    dtype = getattr(torch, base_config.get("dtype") or base_config.get("torch_dtype") or "bfloat16")
    model = AutoModelForCausalLM.from_pretrained(config.base, dtype=torch.float32)
    merged = PeftModel.from_pretrained(model, out / "adapter").merge_and_unload()
    target = out / "merged"
    for previous in ("merged", "merged-patched", "merged-quantized"):  # a merge again (another recipe) starts afresh
        shutil.rmtree(out / previous, ignore_errors=True)
    merged.to(dtype).save_pretrained(target)
    AutoTokenizer.from_pretrained(config.base).save_pretrained(target)
    return chain(target, lambda step: out / f"merged-{step}", recipe=Path(config.recipe) if config.recipe else None,
                 calibration_tasks=Path(config.calibration_tasks) if config.calibration_tasks else None,
                 kv_scales=config.kv_scales)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m training.rft", description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", required=True, type=Path)
    parser.add_argument("--merge", action="store_true")
    args = parser.parse_args(argv)
    try:
        config = load_config(args.config)
    except strict_toml.TomlError as err:  # a bad config: one line naming the file and key, exit 2 like argparse
        print(f"python -m training.rft: {err}", file=sys.stderr)
        return 2
    if args.merge:
        print(merge(config))
        return 0
    line = ProgressLine()
    losses = train(config, progress=lambda s, n, loss: line.update(f"step {s}/{n} loss {loss:.4f}", final=s == n))
    line.close()
    out = Path(config.out)
    print(f"{len(losses)} steps, loss {losses[0]:.4f} -> {losses[-1]:.4f}; adapter in {out / 'adapter'}; "
          f"loss curve {out / 'loss.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
