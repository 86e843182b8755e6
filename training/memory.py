"""Training memory at the study's length: RFT v1 trained 81,920-token rows of a 27B on one 96 GB GPU with re-entrant
gradient checkpointing, activation offload to host memory, MLPs chunked over 8,192 positions and cross-entropy chunked
over 2,048 positions (seed ~4436-4438; peak 85 GiB). Without the chunked loss one such row's fp32 logits over a
~152k vocabulary are ~50 GB on their own.

Built from PyTorch's and transformers' own facilities, so the CPU tests run the code a GPU runs:
- checkpointing: transformers' `gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})`;
- offload: `torch.autograd.graph.save_on_cpu` around the forward, so what checkpointing keeps (each layer's input,
  64 x 81,920 x 5,120 bf16 = 54 GB for the 27B) waits in host memory (pinned on a GPU) instead of on the device;
- chunked MLP and loss: `torch.utils.checkpoint` over slices of positions (DeepSpeed ALST's TiledMLP and tiled
  logits+loss do the same; liger-kernel's fused linear cross-entropy and cut-cross-entropy are Triton/GPU-only kernels,
  and a GPU-only path would leave the CPU tests measuring something else). Each slice's intermediates (MLP: ~1 GB at
  8,192 positions of the 27B; loss: 2,048 x vocab fp32 logits) live only while that slice runs, forward or backward.
The loss is the same token mean as transformers' ForCausalLMLoss (fp32 logits, labels shifted by one, -100 ignored).
"""

from __future__ import annotations

from dataclasses import dataclass

IGNORE = -100


@dataclass(frozen=True)
class MemoryPlan:
    """What one training step does to keep memory linear in the row's length. Pure data."""
    reentrant: bool  # re-entrant gradient checkpointing (the study's); None of it when gradient checkpointing is off
    offload: bool  # saved activations to host memory (torch.autograd.graph.save_on_cpu)
    pin_memory: bool  # host copies pinned (fast copies back to a GPU; a CPU-only torch cannot pin)
    mlp_chunk: int  # positions per MLP slice (0 = whole)
    loss_chunk: int  # positions per cross-entropy slice (0 = the model's own loss over full logits)


def memory_plan(gradient_checkpointing: bool, offload: bool, mlp_chunk: int, loss_chunk: int, backend: str,
                device: str) -> MemoryPlan:
    """The plan for a config on a device. unsloth's own gradient checkpointing ("unsloth") already offloads what it
    saves to host memory, so the kit adds no second offload there. Pure."""
    offload = offload and backend == "peft"
    return MemoryPlan(reentrant=gradient_checkpointing, offload=offload,
                      pin_memory=offload and device.startswith("cuda"), mlp_chunk=mlp_chunk, loss_chunk=loss_chunk)


def spans(length: int, size: int) -> list[tuple[int, int]]:
    """[start, end) slices of `size` positions covering `length` (one slice when size is 0). Pure."""
    if size <= 0:
        return [(0, length)]
    return [(start, min(start + size, length)) for start in range(0, length, size)]


def chunk_mlps(model, size: int) -> int:
    """Make every decoder layer's MLP (`layers.N.mlp`, dense or MoE: both act per position) run over slices of
    `size` positions, each slice checkpointed. The module tree and its names stay as they are (PEFT and saving see
    nothing); returns how many MLPs were chunked, and refuses a model in which none is found."""
    import functools

    mlps = [m for name, m in model.named_modules() if name.split(".")[-3::2] == ["layers", "mlp"]]
    if not mlps:
        raise ValueError("mlp_chunk: no decoder layer MLP (layers.N.mlp) in the model; set mlp_chunk = 0")
    for mlp in mlps:
        mlp.forward = functools.partial(_chunked, mlp.forward, size)
    return len(mlps)


def _chunked(forward, size: int, hidden):
    import torch
    from torch.utils.checkpoint import checkpoint

    if hidden.shape[1] <= size:
        return forward(hidden)
    return torch.cat([checkpoint(forward, hidden[:, a:b], use_reentrant=False)
                      for a, b in spans(hidden.shape[1], size)], dim=1)


def chunked_loss(hidden, head, labels, size: int):
    """Token-mean cross-entropy of `head(hidden)` against `labels` shifted by one (position t predicts label t+1),
    computed `size` positions at a time, each slice checkpointed so its logits exist only while it runs."""
    import torch
    from torch.utils.checkpoint import checkpoint

    targets = torch.nn.functional.pad(labels[:, 1:], (0, 1), value=IGNORE)
    count = (targets != IGNORE).sum()
    total = sum(checkpoint(_slice_loss, head, hidden[:, a:b], targets[:, a:b], use_reentrant=False)
                for a, b in spans(hidden.shape[1], size))
    return total / count


def _slice_loss(head, hidden, targets):
    import torch

    logits = head(hidden).float()
    return torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]), targets.reshape(-1),
                                             ignore_index=IGNORE, reduction="sum")


def row_loss(model, input_ids, labels, plan: MemoryPlan):
    """One row's token-mean loss through `model` (a PEFT model over a causal LM) under `plan`; call `.backward()`
    on it outside (the offload covers the forward: the backward's recomputation needs no host round trip)."""
    import contextlib

    import torch

    offload = torch.autograd.graph.save_on_cpu(pin_memory=plan.pin_memory) if plan.offload \
        else contextlib.nullcontext()
    with offload:
        if not plan.loss_chunk:
            return model(input_ids=input_ids, labels=labels, use_cache=False).loss
        lm = model.get_base_model() if hasattr(model, "get_base_model") else model
        hidden = lm.get_decoder()(input_ids=input_ids, use_cache=False).last_hidden_state
        return chunked_loss(hidden, lm.get_output_embeddings(), labels, plan.loss_chunk)
