"""Static activation scales: the largest input each quantised projection sees on calibration prompts, observed layer
by layer together with the FP8 KV-cache scales (build.kv_scales) in one pass.

Static schemes quantise activations with a scale fixed in the checkpoint instead of one computed per token:
`FP8` (per-tensor FP8 weights and inputs; input_scale = amax / 448) and `NVFP4` (W4A4; input_global_scale =
448 x 6 / amax, as for weights). The amax comes from the solver's own prompts (build.kv_scales.calibration_prompts).
The model runs one decoder layer at a time from its shards (build.layerwise, as build.calibrate does): memory is one
layer's weights plus the prompts' hidden states, so an 80B MoE calibrates its scales in the memory of one layer.
Linear modules are observed with forward pre-hooks; the routed experts of a MoE block, which transformers keeps fused,
are observed in the experts' forward: each expert's gate/up input is the hidden state of the tokens routed to it, its
down input the activation computed from its own weights. `lm_head`'s input is the final normed hidden state. MTP
layers (`mtp.*`) are not part of the transformers model and get no observation, as before.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable


def observe_inputs(root, prefix: str, amax: dict[str, float]) -> list:
    """Hooks on every linear module and fused-expert block under `root` that raise `amax[prefix + module name]` to the
    largest absolute input seen; returns the handles. `root` is a whole model (prefix "") or one decoder layer."""
    import torch

    def note(name: str, value: float) -> None:
        amax[name] = max(amax.get(name, 0.0), value)

    handles = []
    for name, module in root.named_modules():
        name = prefix + name
        if isinstance(module, torch.nn.Linear):
            handles.append(module.register_forward_pre_hook(
                lambda m, args, name=name: note(name, float(args[0].detach().abs().max()))))
        elif hasattr(module, "gate_up_proj") and hasattr(module, "down_proj"):
            def experts(m, args, kwargs, output, name=name):
                names = ("hidden_states", "top_k_index", "top_k_weights")
                hidden, index = (list(args) + [kwargs[n] for n in names[len(args):]])[:2]
                with torch.no_grad():
                    for e in torch.unique(index).tolist():
                        rows = hidden[torch.where(index == e)[0]]
                        note(f"{name}.{e}.gate_proj", float(rows.abs().max()))
                        note(f"{name}.{e}.up_proj", float(rows.abs().max()))
                        gate, up = torch.nn.functional.linear(rows, m.gate_up_proj[e]).chunk(2, dim=-1)
                        note(f"{name}.{e}.down_proj", float((m.act_fn(gate) * up).abs().max()))
            handles.append(module.register_forward_hook(experts, with_kwargs=True))
    return handles


@dataclass(frozen=True)
class Amax:
    inputs: dict[str, float]  # module (checkpoint name without `.weight`) -> largest absolute input
    kv: dict[str, tuple[float, float]]  # attention module -> (key bound, value amax), see build.kv_scales


def activation_amax(model_dir: str | Path, prompts: list[list[int]], device: str = "cpu", inputs: bool = True,
                    kv: bool = True, chunk_tokens: int = 65536, on_step: Callable | None = None) -> Amax:
    """Input amax (with `inputs`) and KV amax (with `kv`) over the prompts, in one layer-by-layer pass: one decoder
    layer resident, the hidden states of at most `chunk_tokens` tokens of prompts kept between layers. `on_step` sees
    build.layerwise's Step after each layer."""
    from build.kv_scales import observe_kv
    from build.layerwise import LayerRunner

    runner = LayerRunner(model_dir, device, "float32")
    found_inputs: dict[str, float] = {}
    found_kv: dict[str, list[float]] = {}

    def on_layer(index: int, layer, group: list[int]) -> list:
        prefix = f"model.layers.{index}."
        return ((observe_inputs(layer, prefix, found_inputs) if inputs else [])
                + (observe_kv(layer, prefix, found_kv) if kv else []))

    for _, hidden in runner.run(prompts, chunk_tokens, on_layer, on_step):
        if inputs:
            for h in hidden:
                found_inputs["lm_head"] = max(found_inputs.get("lm_head", 0.0), float(h.abs().max()))
    return Amax(found_inputs, {name: (k, v) for name, (k, v) in found_kv.items()})


def input_amax(model_dir: str | Path, prompts: list[list[int]], device: str = "cpu") -> dict[str, float]:
    """Module name (as in the checkpoint, without `.weight`) -> largest absolute input value over the prompts."""
    return activation_amax(model_dir, prompts, device, kv=False).inputs
