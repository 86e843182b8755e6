"""build.pipeline end to end on a tiny Qwen3-MoE (prune, patch, quantise, bundle), the chain's order, and split
files reassembled at boot. Needs the build environment (make build-env) and the CPU target's wheels (make wheels)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("compressed_tensors.entrypoints.convert.converters.magnitude_expert_pruner",
                    reason="the pipeline needs the build environment (make build-env)")

from build.bundle.bundler import bundle, verify  # noqa: E402
from build.models.tiny import make_checkpoint  # noqa: E402
from build.pipeline import chain, run  # noqa: E402
from offline_wheels.lock import sha256  # noqa: E402
from submission.kaggle.bundle_files import join_split_files  # noqa: E402


def test_prune_patch_quantise_bundle(tmp_path):
    model = make_checkpoint(tmp_path / "moe", "qwen3_moe", seed=0, patched=False,
                            widths={"moe_intermediate_size": 128})  # the W4A16 recipe's groups of 128
    (tmp_path / "list.json").write_text(json.dumps({"name": "half", "experts": [[0, 2, 4, 6], [1, 3, 5, 7]]}))
    dataset = run("moe-4xL4", "cpu-py311", tmp_path / "out", model, tmp_path / "list.json",
                  Path("build/recipes/moe-4xL4.toml"))
    manifest = json.loads((dataset / "manifest.json").read_text())
    provenance = manifest["model"]
    assert provenance["pruning"]["list_name"] == "half" and provenance["quantization"]["recipe"] == "moe-4xL4"
    assert provenance["patches"]["end_of_turn_rows_zeroed"]
    config = json.loads((dataset / "model" / "config.json").read_text())
    assert config["num_local_experts"] == 4 and "quantization_config" in config
    assert verify(dataset) == []
    config_file = dataset / "model" / "config.json"
    text = config_file.read_text()
    config_file.write_text(text.replace('"', "'", 1) if '"' in text else text)  # same size, other bytes
    assert verify(dataset) == ["sha256 differs: model/config.json"]  # every hash at build time, model included
    config_file.write_text("{}")
    assert verify(dataset) == ["size differs: model/config.json"]


@pytest.mark.parametrize("scheme", ["FP8_DYNAMIC", "NVFP4A16"])
def test_the_chain_patches_before_quantising_so_the_head_is_quantised_with_its_end_rows_zero(tmp_path, read_tensors,
                                                                                           scheme):
    """A recipe that quantises the output head: patched first, the head (for a tied checkpoint, the untied copy the
    patch makes) is quantised as the recipe says and its end-of-turn rows stay exactly zero. Quantised first, a tied
    head is not there to quantise (the recipe's rule is skipped, the patch then writes a BF16 head) and an NVFP4 head
    has no `lm_head.weight` for the patch to edit."""
    from build.patch_eot import PATCH_KEY
    from build.schemes import dequantize

    model = make_checkpoint(tmp_path / "tied", "qwen3", seed=0, patched=False, tied=True)
    (tmp_path / "head.toml").write_text(f'name = "head"\n[[rules]]\npattern = "^lm_head$"\nscheme = "{scheme}"\n')
    result = chain(model, lambda step: tmp_path / step, recipe=tmp_path / "head.toml")
    assert result == tmp_path / "quantized" and (tmp_path / "patched").exists()
    config = json.loads((result / "config.json").read_text())
    assert config["quantization_config"]["config_groups"]["group_0"]["targets"] == ["lm_head"]
    tensors = read_tensors(result)
    head = dequantize({k: v for k, v in tensors.items() if k.startswith("lm_head.")}, "lm_head", scheme).float()
    rows = config[PATCH_KEY]["end_of_turn_rows_zeroed"]
    assert rows and head[rows].abs().max() == 0 and head.abs().sum(1).gt(0).sum() == head.shape[0] - len(rows)


def test_split_files_are_reassembled(tmp_path):
    model = make_checkpoint(tmp_path / "model", "qwen3", seed=0)
    dataset = bundle("cpu-tiny", model, tmp_path / "dataset", max_file_bytes=100_000)
    parts = sorted((dataset / "model").glob("model.safetensors.part*"))
    assert len(parts) > 1 and not (dataset / "model" / "model.safetensors").exists()
    assert verify(dataset) == []
    joined = join_split_files(dataset, tmp_path / "work") / "model"
    assert sha256(joined / "model.safetensors") == sha256(model / "model.safetensors")


def test_a_grid_bundle_carries_its_adapter_inside_the_model(tmp_path):
    """Issue 29: the bundle carries the base and the adapter; the profile's relative model.adapter finds it inside
    the model folder wherever boot mounts it. An adapter the run could not find is refused before any copy."""
    from build.models.grid_vocab import cut

    grid = cut(make_checkpoint(tmp_path / "base", "qwen3", seed=0), tmp_path / "grid")
    adapter = tmp_path / "tuned"
    adapter.mkdir()
    (adapter / "adapter_config.json").write_text("{}")
    (adapter / "adapter_model.safetensors").write_bytes(b"weights")
    tiny = Path("profiles/grid-tiny.toml").read_text()
    profile = tmp_path / "grid-adapter.toml"
    profile.write_text(tiny.replace("[model]\n", '[model]\nadapter = "adapter"\n'))
    with pytest.raises(ValueError, match="adapter/adapter_config.json is missing"):
        bundle(str(profile), grid, tmp_path / "none")  # named, but neither in the model nor passed
    dataset = bundle(str(profile), grid, tmp_path / "dataset", adapter=adapter)
    assert (dataset / "model" / "adapter" / "adapter_model.safetensors").read_bytes() == b"weights"
    assert json.loads((dataset / "manifest.json").read_text())["adapter"]["folder"] == "model/adapter"
    assert verify(dataset) == []
    with pytest.raises(ValueError, match="model.adapter names its folder"):
        bundle("grid-tiny", grid, tmp_path / "unnamed", adapter=adapter)
    outside = tmp_path / "grid-outside.toml"
    outside.write_text(tiny.replace("[model]\n", f'[model]\nadapter = "{adapter}"\n'))
    with pytest.raises(ValueError, match="outside the bundle"):
        bundle(str(outside), grid, tmp_path / "outside", adapter=adapter)
    assert not any((tmp_path / name).exists() for name in ("none", "unnamed", "outside"))
