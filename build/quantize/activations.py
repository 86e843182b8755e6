"""One layer-by-layer pass over calibration prompts observing what the scales need: the inputs of the quantised
projections (build.quantize.input_scales' hooks) and the keys and values of the attention layers
(build.quantize.kv_scales' hooks).

One pass for both because each pass loads every layer of the checkpoint from its shards (build.layerwise: one decoder
layer resident); static input scales and KV-cache scales were two passes before.
build.quantize.quantizer.calibrated_scales turns what this observes into the scales a recipe needs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from build.layerwise import LayerRunner
from build.quantize.input_scales import observe_inputs
from build.quantize.kv_scales import observe_kv


@dataclass(frozen=True)
class Amax:
    inputs: dict[str, float]  # module (checkpoint name without `.weight`) -> largest absolute input
    kv: dict[str, tuple[float, float]]  # attention module -> (key bound, value amax), see build.quantize.kv_scales


def activation_amax(model_dir: str | Path, prompts: list[list[int]], device: str = "cpu", inputs: bool = True,
                    kv: bool = True, chunk_tokens: int = 65536, on_step: Callable | None = None) -> Amax:
    """Input amax (with `inputs`) and KV amax (with `kv`) over the prompts, in one layer-by-layer pass: one decoder
    layer resident, the hidden states of at most `chunk_tokens` tokens of prompts kept between layers. `on_step` sees
    build.layerwise's Step after each layer."""
    runner = LayerRunner(model_dir, device, "float32")
    found_inputs: dict[str, float] = {}
    found_kv: dict[str, list[float]] = {}

    def on_layer(index: int, layer, group: list[int]) -> list:
        prefix = f"{runner.prefix}layers.{index}."  # the checkpoint's names (Qwen3.5: model.language_model.)
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


def kv_amax(model_dir: str | Path, prompts: list[list[int]], device: str = "cpu") -> dict[str, tuple[float, float]]:
    """Per attention module name (`model.layers.N.self_attn`): (key bound, value amax) over the prompts
    (build.quantize.kv_scales.scales turns them into scales)."""
    return activation_amax(model_dir, prompts, device, inputs=False).kv
