"""FP8 KV-cache scales (`k_scale`, `v_scale` per attention layer) calibrated on prompts rendered by the solver.

vLLM stores keys and values in FP8 (`kv_cache_dtype="fp8"`) with a per-layer scale read from the checkpoint, else
1.0 with a warning; the study's calibrated FP8 KV cache moved the log-likelihood by < 0.0005 nats/token. Scale =
amax / 448 (the E4M3 maximum) over the calibration tokens. Values are the v_proj outputs. Keys are cached after
RoPE, which rotates each pair (i, i + d/2) of a head's dimensions: the largest post-RoPE component is bounded by the
largest norm of such a pair of the pre-RoPE keys (after q/k norm), so that bound is used: exact for some position,
never too small. Layers without softmax attention (linear attention) have no KV cache and get no scales. The model
runs one decoder layer at a time from its shards, with the static input scales when a recipe needs them
(build.quantize.activations: one pass observes both): memory is one layer plus the prompts' hidden states. This module
holds the prompts, the hooks that observe keys and values, and the scales.
"""

from __future__ import annotations

from pathlib import Path

FP8_MAX = 448.0


def calibration_prompts(model_dir: str | Path, tasks, samples: int) -> list[list[int]]:
    """The first test input of up to `samples` tasks, rendered exactly as the solver sends them."""
    from transformers import AutoTokenizer

    from submission.reasoning.profile import PromptConfig
    from submission.reasoning.prompt import render

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    return [render(tokenizer, task, 0, PromptConfig())[1] for task in list(tasks)[:samples]]


def observe_kv(root, prefix: str, amax: dict[str, list[float]]) -> list:
    """Hooks on every attention module under `root` (a module with k_proj and v_proj) that raise
    `amax[prefix + its name]` = [key bound, value amax]; returns the handles. `root` is a whole model (prefix "") or
    one decoder layer."""
    import torch

    handles = []
    for name, module in root.named_modules():
        if not (hasattr(module, "k_proj") and hasattr(module, "v_proj")):
            continue
        name = prefix + name
        amax.setdefault(name, [0.0, 0.0])
        head_dim = module.head_dim

        def keys(_m, _a, out, name=name, head_dim=head_dim):
            k = out.float().reshape(*out.shape[:-1], -1, head_dim) if out.shape[-1] != head_dim else out.float()
            half = head_dim // 2
            pair = torch.sqrt(k[..., :half] ** 2 + k[..., half:] ** 2)
            amax[name][0] = max(amax[name][0], float(pair.max()))

        def values(_m, _a, out, name=name):
            amax[name][1] = max(amax[name][1], float(out.float().abs().max()))

        source = module.k_norm if hasattr(module, "k_norm") else module.k_proj
        handles += [source.register_forward_hook(keys), module.v_proj.register_forward_hook(values)]
    return handles


def scales(amax: dict[str, tuple[float, float]]) -> dict[str, float]:
    """Tensor name -> scale, as vLLM reads them (`<attention>.k_scale`, `<attention>.v_scale`). Pure."""
    out = {}
    for name, (k, v) in amax.items():
        out[f"{name}.k_scale"] = max(k, 1e-12) / FP8_MAX
        out[f"{name}.v_scale"] = max(v, 1e-12) / FP8_MAX
    return out
