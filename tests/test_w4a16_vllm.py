"""The study's W4A16 quantization_config as vLLM itself reads it (engine environment): the config build.quantize
writes for build/recipes/moe-4xL4.toml (tests/w4a16_quantization_config.json, which tests/test_quantize.py checks
against the quantiser's real output in the build environment, module names reduced to their leaves) parsed by the
installed vLLM's `CompressedTensorsConfig` (the CPU build, 0.32), and the functions that decide it compared with the
locked vLLM 0.33 GPU wheel's (read as a zip, as tests/test_fused_groups.py does; skipped without the wheel): the
same source, so the same decision on the L4. The decisions are in
vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py (`_is_wNa16_group_channel` and
`_get_scheme_from_parts`: a static INT group or channel weight with no activation quantisation, in the pack-quantized
format, is `CompressedTensorsWNA16`, Marlin on the L4) and, for the routed experts,
compressed_tensors_moe/compressed_tensors_moe.py (`get_moe_method`: the same test, bits in `WNA16_SUPPORTED_BITS` and
pack-quantized, else a ValueError)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM's CPU build is in the engine environment (make engine-env)")

CONFIG = Path(__file__).parent / "w4a16_quantization_config.json"
NAMES = {"down_proj": "model.layers.0.mlp.experts.0.down_proj", "gate_proj": "model.layers.0.mlp.experts.0.gate_proj",
         "up_proj": "model.layers.0.mlp.experts.0.up_proj", "in_proj_qkvz": "model.layers.0.linear_attn.in_proj_qkvz",
         "in_proj_ba": "model.layers.0.linear_attn.in_proj_ba", "out_proj": "model.layers.0.linear_attn.out_proj"}


def test_vllm_reads_the_w4a16_config_as_weight_only_int4_experts_and_int8_linear_attention():
    import vllm
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import CompressedTensorsConfig
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes import CompressedTensorsWNA16
    from vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_wNa16 import (
        WNA16_SUPPORTED_BITS)

    raw = json.loads(CONFIG.read_text())
    raw["config_groups"] = {key: dict(group, targets=[NAMES[t] for t in group["targets"]])
                            for key, group in raw["config_groups"].items()}
    config = CompressedTensorsConfig.from_config(raw)
    assert sorted(config.target_scheme_map) == sorted(NAMES.values())
    found = {}
    for target, parts in config.target_scheme_map.items():
        weights, inputs, layer_format = parts["weights"], parts["input_activations"], parts.get("format")
        assert config._is_wNa16_group_channel(weights, inputs)
        assert (layer_format or config.quant_format) == "pack-quantized" and weights.num_bits in WNA16_SUPPORTED_BITS
        scheme = config._get_scheme_from_parts(weights, inputs, format=layer_format, layer_name=target)
        assert isinstance(scheme, CompressedTensorsWNA16)
        found[target.rpartition(".")[2]] = (weights.num_bits, scheme.group_size, weights.symmetric)
    assert {leaf: found[leaf] for leaf in ("up_proj", "down_proj")} == {"up_proj": (4, 128, True),
                                                                        "down_proj": (4, 128, True)}
    assert found["in_proj_qkvz"] == found["out_proj"] == (8, -1, True)  # per output channel


CT = "vllm/model_executor/layers/quantization/compressed_tensors/"
DECIDING = {CT + "compressed_tensors.py": ("_is_wNa16_group_channel", "_get_scheme_from_parts"),
            CT + "compressed_tensors_moe/compressed_tensors_moe.py": ("get_moe_method",)}


def test_the_deciding_functions_are_the_locked_gpu_wheels():
    import ast
    import zipfile

    import vllm

    wheels = Path.home() / ".cache" / "arc-kit" / "wheels" / "vllm-0.33.0"
    wheel = next(iter(sorted(wheels.glob("vllm-0.33.0-*.whl"))), None)
    if wheel is None:
        pytest.skip(f"no vLLM 0.33 wheel in {wheels} (pip download --no-deps vllm==0.33.0 -d {wheels})")
    installed = Path(vllm.__file__).parent.parent

    def functions(source: str, names: tuple[str, ...]) -> dict[str, str]:
        return {node.name: ast.get_source_segment(source, node) for node in ast.walk(ast.parse(source))
                if isinstance(node, ast.FunctionDef) and node.name in names}

    archive = zipfile.ZipFile(wheel)
    for path, names in DECIDING.items():
        locked = functions(archive.read(path).decode(), names)
        assert sorted(locked) == sorted(names), path
        assert locked == functions((installed / path).read_text(), names), path
