"""The kit's quantisation schemes as compressed-tensors knows them: names, storage formats, the library's scheme
objects, and the way back (dequantising a stored module, naming the scheme of a stored config group).

Shared by the writer (build.quantize) and the readers (build.layerwise runs quantised checkpoints layer by layer,
tests/reference_quantize.py rebuilds the writer's output): kept apart from the writer so a reader needs none of it,
and so the writer's calibration pass (build.quantize.activations -> build.layerwise) does not lead back into the writer.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SCHEMES = ("NVFP4A16", "NVFP4", "FP8_DYNAMIC", "FP8", "W4A16", "W8A16_CHANNEL", "BF16")
FORMATS = {"NVFP4A16": "nvfp4-pack-quantized", "NVFP4": "nvfp4-pack-quantized", "FP8_DYNAMIC": "float-quantized",
           "FP8": "float-quantized", "W4A16": "pack-quantized", "W8A16_CHANNEL": "pack-quantized"}
STATIC = ("NVFP4", "FP8")  # schemes whose activation scales are calibrated (build.quantize.input_scales)


def library_scheme(name: str, targets: list[str]):
    """compressed-tensors' scheme of a kit scheme name: its preset, but for W8A16_CHANNEL (the preset W8A16 has
    groups of 128; the study's linear-attention projections were INT8 per channel)."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme, preset_name_to_scheme

    if name == "W8A16_CHANNEL":
        return QuantizationScheme(targets=targets, weights=QuantizationArgs(
            num_bits=8, type="int", symmetric=True, strategy="channel", dynamic=False))
    return preset_name_to_scheme(name, targets)


@functools.cache
def compression_scheme(name: str):
    """The scheme the compressors are handed: its targets play no part there, so one object per scheme name serves
    every tensor (building one per call cost ~10% of quantising a tiny-width checkpoint)."""
    return library_scheme(name, ["Linear"])


def dequantize(state: dict[str, "torch.Tensor"], module: str, scheme_name: str) -> "torch.Tensor":
    """A stored module's weight back from its tensors (`state`: full tensor names) by the library's compressor."""
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor

    local = {k[len(module) + 1:]: v for k, v in state.items() if k.startswith(module + ".")}
    compressor = {"nvfp4-pack-quantized": NVFP4PackedCompressor, "float-quantized": FloatQuantizationCompressor,
                  "pack-quantized": PackedQuantizationCompressor}[FORMATS[scheme_name]]
    return compressor.decompress(local, compression_scheme(scheme_name))["weight"]


def preset_of(group: dict) -> str:
    """The kit's scheme name of a compressed-tensors config group (as build.quantize writes them)."""
    weights, inputs = group.get("weights") or {}, group.get("input_activations")
    if weights.get("type") == "int":
        found = (weights.get("num_bits"), weights.get("strategy"), weights.get("group_size"), weights.get("symmetric"))
        known = {(4, "group", 128, True): "W4A16", (8, "channel", None, True): "W8A16_CHANNEL"}
        if found not in known:
            raise ValueError(f"config.json: quantization_config group {group.get('targets', [])[:2]}...: INT weights "
                             f"(bits, strategy, group size, symmetric) {found}, not one of {sorted(known.values())}")
        return known[found]
    if weights.get("num_bits") == 4:
        return "NVFP4" if inputs else "NVFP4A16"
    return "FP8_DYNAMIC" if inputs is None or inputs.get("dynamic") else "FP8"
