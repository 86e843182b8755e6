"""Quantisation recipes on tiny checkpoints: every output file equal byte for byte to compressed-tensors' own
converter and compressors (tests/reference_quantize.py) across architectures, shardings, static schemes and KV-cache
scales; NVFP4 and INT4/INT8 bytes against independent references of the formats, FP8 per channel, shared global
scales of fused projections, untouched BF16 parts, the quantization_config (the W4A16 one as vLLM 0.33 reads it), and
a dequantised checkpoint that transformers loads.
Needs the build environment (make build-env)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("compressed_tensors.entrypoints.convert.converters.magnitude_expert_pruner",
                    reason="quantisation needs the build environment (make build-env)")

import torch  # noqa: E402

from build.models.tiny import make_checkpoint  # noqa: E402
from build.quantize.quantizer import (Recipe, Rule, dequantize, dequantize_checkpoint, fp8_weights,  # noqa: E402
                                      load_recipe, quantize)
from reference_quantize import reference_quantize  # noqa: E402  (tests/ is on the path)
from submission.strict_toml import TomlError  # noqa: E402

E2M1 = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
RECIPE = "build/recipes/moe-4xL4.toml"  # the study's W4A16 format
NVFP4_RECIPE = "build/recipes/moe-4xL4-nvfp4.toml"  # the kit's own NVFP4/FP8 alternative
GROUPS_OF_128 = {"moe_intermediate_size": 128}  # tiny experts whose down_proj inputs fill W4A16's groups of 128
VLLM_CONFIG = Path(__file__).parent / "w4a16_quantization_config.json"  # read by tests/test_w4a16_vllm.py
STATIC_RULES = r"""
[[rules]]
pattern = '\.experts\.\d+\.(gate|up|down)_proj$'
scheme = "NVFP4"
[[rules]]
pattern = '\.self_attn\.(q|k|v|o)_proj$'
scheme = "FP8"
"""


def reference_nvfp4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """NVFP4 from its definition (LIBRARIES.md): global = 448*6/amax(W); block scale = fp8(global * amax_block / 6);
    values = nearest E2M1 of W * global / block scale; element 2i in the low nibble."""
    w = w.float()
    global_scale = 448.0 * 6.0 / w.abs().max()
    blocks = w.reshape(w.shape[0], -1, 16)
    scale = (global_scale * blocks.abs().amax(-1) / 6.0).to(torch.float8_e4m3fn)
    scaled = blocks / (scale.float() / global_scale)[..., None]
    magnitude = (scaled.abs().clamp(max=6.0)[..., None] - E2M1).abs().argmin(-1)  # nearest (ties: the lower code)
    codes = (magnitude | (scaled < 0).to(torch.long) << 3).reshape(w.shape[0], -1)  # -0 keeps its sign bit
    packed = (codes[:, 0::2] | (codes[:, 1::2] << 4)).to(torch.uint8)
    return packed, scale, global_scale.reshape(1)


def nvfp4_group(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One fused group's float32 weights through build.quantize.nvfp4, as the compressed tensors the quantiser
    writes."""
    from build.quantize.nvfp4 import quantize as nvfp4

    names = list(weights)
    flat = torch.cat([w.reshape(-1) for w in weights.values()]).numpy()
    starts = torch.tensor([0] + [w.numel() for w in weights.values()]).cumsum(0)[:-1].tolist()
    q = nvfp4(flat, starts, [w.shape[0] for w in weights.values()], [w.shape[1] for w in weights.values()],
              [0] * len(names), names)
    out = {}
    for i, (name, w) in enumerate(weights.items()):
        at, blocks = int(q.scales_at[i]), w.numel() // 16
        out[f"{name}.weight_packed"] = torch.from_numpy(q.packed[at * 8:at * 8 + blocks * 8].copy()).reshape(
            w.shape[0], -1)
        out[f"{name}.weight_scale"] = torch.from_numpy(q.scales[at:at + blocks].copy()).view(
            torch.float8_e4m3fn).reshape(w.shape[0], -1)
        out[f"{name}.weight_global_scale"] = torch.tensor([q.global_scales[i]])
    return out


def test_nvfp4_matches_the_format_definition_byte_for_byte():
    torch.manual_seed(0)
    weights = {"layer.up_proj": torch.randn(64, 128) * 0.02, "layer.gate_proj": torch.randn(64, 128) * 0.05}
    packed = nvfp4_group(weights)
    joint = torch.cat([weights["layer.up_proj"], weights["layer.gate_proj"]])  # fused: one global scale
    ref_packed, ref_scale, ref_global = reference_nvfp4(joint)
    assert torch.equal(packed["layer.up_proj.weight_global_scale"], ref_global)
    assert torch.equal(packed["layer.gate_proj.weight_global_scale"], ref_global)
    assert torch.equal(torch.cat([packed["layer.up_proj.weight_packed"], packed["layer.gate_proj.weight_packed"]]),
                       ref_packed)
    assert torch.equal(torch.cat([packed["layer.up_proj.weight_scale"], packed["layer.gate_proj.weight_scale"]]).view(
        torch.uint8), ref_scale.view(torch.uint8))


def test_fp8_is_per_channel():
    torch.manual_seed(1)
    w = torch.randn(32, 64)
    out = fp8_weights({"m.o_proj": w}, "FP8_DYNAMIC")
    scale = w.abs().amax(1, keepdim=True) / 448.0
    assert out["m.o_proj.weight"].dtype == torch.float8_e4m3fn and out["m.o_proj.weight_scale"].shape == (32, 1)
    assert torch.allclose(out["m.o_proj.weight_scale"].float(), scale)
    assert torch.equal(out["m.o_proj.weight"].view(torch.uint8), (w / scale).to(torch.float8_e4m3fn).view(torch.uint8))


def test_recipes():
    recipe = load_recipe("build/recipes/dense-27b-4xL4.toml")
    assert recipe.scheme_for("model.layers.3.mlp.up_proj") == "NVFP4A16"
    assert recipe.scheme_for("model.layers.60.mlp.up_proj") == "FP8_DYNAMIC"
    assert recipe.scheme_for("model.layers.3.self_attn.q_proj") == "FP8_DYNAMIC"
    assert recipe.scheme_for("model.layers.3.input_layernorm") == "BF16"
    assert Recipe("r", (Rule(r"x", "FP8_DYNAMIC", (0, 1)),)).scheme_for("model.layers.2.x") == "BF16"
    assert Recipe("r", (Rule(r"x", "FP8_DYNAMIC", (0, 1)),)).scheme_for("mtp.layers.0.x") == "BF16"  # not layer 0
    assert Recipe("r", (Rule(r"x", "FP8_DYNAMIC"),)).scheme_for("mtp.layers.0.x") == "FP8_DYNAMIC"
    assert {load_recipe(p).check.max_nll_increase for p in Path("build/recipes").glob("*.toml")} == {0.02}


def test_bad_recipe(tmp_path):
    """Every way a recipe file can be wrong stops the build before any work, naming the file and the key."""
    path = tmp_path / "r.toml"
    with pytest.raises(TomlError, match=r"r\.toml: cannot read"):
        load_recipe(path)
    path.write_text('[[rules]]\npattern = "x"\nscheme = "INT3"\n')
    with pytest.raises(TomlError, match=r"r\.toml\.rules\[0\]: scheme must be one of .*, not 'INT3'"):
        load_recipe(path)
    path.write_text('[[rules]]\npattern = "("\nscheme = "BF16"\n')
    with pytest.raises(TomlError, match=r"r\.toml\.rules\[0\]: pattern '\(': missing \)"):
        load_recipe(path)
    path.write_text('[[rules]]\nscheme = "BF16"\n')
    with pytest.raises(TomlError, match=r"r\.toml\.rules\[0\]: .*missing .*'pattern'"):
        load_recipe(path)
    path.write_text('[[rules]]\npattern = "x"\nscheme = "BF16"\nlayer = [0, 3]\n')
    with pytest.raises(TomlError, match=r"r\.toml\.rules\[0\]: unknown key\(s\) layer"):
        load_recipe(path)
    path.write_text('[[rules]]\npattern = "x"\nscheme = "BF16"\nlayers = [3]\n')
    with pytest.raises(TomlError, match=r"r\.toml\.rules\[0\]: layers must be \[first, last\]"):
        load_recipe(path)
    path.write_text('[[rules]]\npattern = "x"\nscheme = "BF16"\n[check]\nmax_nll_increse = 0.1\n')
    with pytest.raises(TomlError, match=r"r\.toml\.check: unknown key\(s\) max_nll_increse"):
        load_recipe(path)
    path.write_text('nmae = "r"\n[[rules]]\npattern = "x"\nscheme = "BF16"\n')
    with pytest.raises(TomlError, match=r"r\.toml: unknown key\(s\) nmae"):
        load_recipe(path)
    path.write_text('[[rules]]\npattern = "x"\nscheme = "BF16"\nlayers = [2, 4]\n[check]\nmax_nll_increase = 1\n')
    recipe = load_recipe(path)
    assert (recipe.name, recipe.rules[0].layers, recipe.check.max_nll_increase) == ("r", (2, 4), 1.0)


def test_recipes_that_match_nothing_or_split_a_fused_linear_are_refused(tmp_path):
    source = make_checkpoint(tmp_path / "model", "qwen3", seed=0)
    (tmp_path / "none.toml").write_text('name = "typo"\n[[rules]]\npattern = "\\\\.mpl\\\\."\nscheme = "NVFP4A16"\n')
    with pytest.raises(ValueError, match=r"recipe 'typo': its patterns \[.*mpl.*\] match no quantisable weight"):
        quantize(source, tmp_path / "none.toml", tmp_path / "q")
    (tmp_path / "split.toml").write_text('[[rules]]\npattern = "q_proj$"\nscheme = "FP8_DYNAMIC"\n')
    with pytest.raises(ValueError, match=r"self_attn.qkv_proj is one linear in vLLM"):
        quantize(source, tmp_path / "split.toml", tmp_path / "q")
    assert not (tmp_path / "q").exists() and not (tmp_path / "q.partial").exists()


def test_quantised_checkpoint_layout_config_and_dequantised_load(tmp_path, read_tensors):
    from transformers import AutoModelForCausalLM

    source = make_checkpoint(tmp_path / "model", "qwen3_moe", seed=0, max_shard_size="300KB")
    report = quantize(source, NVFP4_RECIPE, tmp_path / "q")
    before, after = read_tensors(source), read_tensors(tmp_path / "q")
    expert = "model.layers.1.mlp.experts.3"
    assert after[f"{expert}.up_proj.weight_packed"].dtype == torch.uint8
    assert torch.equal(after[f"{expert}.up_proj.weight_global_scale"], after[f"{expert}.gate_proj.weight_global_scale"])
    assert after["model.layers.0.self_attn.q_proj.weight"].dtype == torch.float8_e4m3fn
    for kept in ("model.layers.0.mlp.gate.weight", "model.embed_tokens.weight", "lm_head.weight",
                 "model.layers.0.input_layernorm.weight"):
        assert torch.equal(after[kept], before[kept])
    config = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    assert config["quant_method"] == "compressed-tensors" and config["quantization_status"] == "compressed"
    targets = {t for group in config["config_groups"].values() for t in group["targets"]}
    assert f"{expert}.down_proj" in targets and "model.layers.1.self_attn.o_proj" in targets
    assert all(0 < row["relative_error"] < 0.2 for row in report.values())

    plain = dequantize_checkpoint(tmp_path / "q", tmp_path / "deq")
    model = AutoModelForCausalLM.from_pretrained(plain, dtype=torch.float32)
    original = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    restored = model.model.layers[1].mlp.experts.gate_up_proj[3]
    reference = original.model.layers[1].mlp.experts.gate_up_proj[3]
    assert 0 < (restored - reference).norm() / reference.norm() < 0.2  # quantised, and close
    ids = torch.randint(0, original.config.vocab_size, (1, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.isfinite(model(ids).logits).all()


def test_likelihood_check_dequantises_a_quantised_candidate(tmp_path):
    from build.check_quality import compare

    source = make_checkpoint(tmp_path / "model", "qwen3", seed=0)
    quantize(source, "build/recipes/dense-27b-4xL4.toml", tmp_path / "q")
    ids = list(range(5, 60))
    trace = {"task_id": "t", "token_ids": ids, "program": [0, 0],
             "segments": {"prompt": [0, 10], "thinking": [10, 50], "answer": [50, len(ids)]}}
    quality = compare(source, tmp_path / "q", [trace])
    assert quality.nll_candidate != quality.nll_reference and abs(quality.difference) < 1.0


def test_kv_cache_scales(tmp_path, arc_data, read_tensors):
    from build.quantize.activations import kv_amax
    from build.quantize.kv_scales import FP8_MAX, calibration_prompts, scales
    from submission.tasks import load_tasks

    source = make_checkpoint(tmp_path / "model", "qwen3", seed=0)
    prompts = calibration_prompts(source, load_tasks(arc_data / "arc-agi-2" / "training").tasks, 3)
    amax = kv_amax(source, prompts)
    assert sorted(amax) == ["model.layers.0.self_attn", "model.layers.1.self_attn"]
    kv = scales(amax)
    quantize(source, NVFP4_RECIPE, tmp_path / "q", kv)
    after = read_tensors(tmp_path / "q")
    assert after["model.layers.1.self_attn.k_scale"].item() == pytest.approx(amax["model.layers.1.self_attn"][0] / FP8_MAX)
    assert after["model.layers.0.self_attn.v_scale"].item() > 0
    scheme = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]["kv_cache_scheme"]
    assert scheme["num_bits"] == 8 and scheme["type"] == "float" and scheme["dynamic"] is False

    # the key bound covers the keys after RoPE at every position of the prompts
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    captured = []
    import transformers.models.qwen3.modeling_qwen3 as qwen3

    real_rope = qwen3.apply_rotary_pos_emb

    def spy(q, k, cos, sin, *a, **kw):
        q2, k2 = real_rope(q, k, cos, sin, *a, **kw)
        captured.append(k2.abs().max().item())
        return q2, k2

    qwen3.apply_rotary_pos_emb = spy
    try:
        with torch.no_grad():
            model(torch.tensor([prompts[0]]))
    finally:
        qwen3.apply_rotary_pos_emb = real_rope
    assert captured and max(captured) <= max(k for k, _ in amax.values()) * (1 + 1e-5)


def test_static_schemes_carry_calibrated_input_scales(tmp_path, arc_data, read_tensors):
    from build.quantize.activations import input_amax
    from build.quantize.kv_scales import calibration_prompts
    from submission.tasks import load_tasks

    source = make_checkpoint(tmp_path / "model", "qwen3_moe", seed=0)
    prompts = calibration_prompts(source, load_tasks(arc_data / "arc-agi-2" / "training").tasks, 2)
    amax = input_amax(source, prompts)
    assert amax["model.layers.0.self_attn.q_proj"] == amax["model.layers.0.self_attn.k_proj"]  # the same input
    assert amax["model.layers.0.mlp.experts.3.gate_proj"] > 0 and "lm_head" in amax
    recipe = tmp_path / "static.toml"
    recipe.write_text(STATIC_RULES)
    with pytest.raises(ValueError, match="needs calibrated inputs"):
        quantize(source, recipe, tmp_path / "nope")
    quantize(source, recipe, tmp_path / "q", input_amax=amax)
    after = read_tensors(tmp_path / "q")
    o = "model.layers.1.self_attn.o_proj"
    assert after[f"{o}.input_scale"].item() == pytest.approx(amax[o] / 448.0)
    assert after[f"{o}.weight_scale"].numel() == 1  # per tensor
    down = "model.layers.0.mlp.experts.5.down_proj"
    assert after[f"{down}.input_global_scale"].item() == pytest.approx(448.0 * 6.0 / amax[down], rel=1e-6)
    groups = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]["config_groups"]
    # FP8: a static input scale; NVFP4 (W4A4): a static global scale with per-group local scales made at run time
    assert sorted(str(g["input_activations"]["dynamic"]) for g in groups.values()) == ["False", "local"]
    report = json.loads((tmp_path / "q" / "quantization_report.json").read_text())["tensors"]
    unrouted = [m for m, row in report.items() if "input_scale_from" in row]
    assert all(m not in amax for m in unrouted)  # only experts calibration never reached borrow a scale


def test_pack_unpack_round_trips():
    from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8, unpack_fp4_from_uint8

    values = torch.cat([E2M1, -E2M1]).repeat(4).reshape(4, 16)  # every code, both signs
    packed = pack_fp4_to_uint8(values)
    assert packed.shape == (4, 8) and packed.dtype == torch.uint8
    assert torch.equal(unpack_fp4_from_uint8(packed, 4, 16, dtype=torch.float32), values)
    # the whole NVFP4 path: dequantising what was quantised gives every representable value back exactly
    w = (values * 0.25).repeat(2, 4)
    out = nvfp4_group({"m.up_proj": w})
    assert torch.equal(dequantize(out, "m.up_proj", "NVFP4A16").float(), w)
    fp8 = fp8_weights({"m.o_proj": w}, "FP8_DYNAMIC")
    assert torch.allclose(dequantize(fp8, "m.o_proj", "FP8_DYNAMIC").float(), w, rtol=0.07, atol=1e-6)


STATIC_RECIPE = STATIC_RULES + r"""[[rules]]
pattern = '\.mlp\.(gate|up|down)_proj$'
scheme = "NVFP4A16"
"""  # and dense MLPs, where a model has them


@pytest.mark.parametrize("arch, recipe, shard", [
    ("qwen3_moe", NVFP4_RECIPE, "300KB"),  # routed experts' gate/up groups across shard boundaries
    ("qwen3_next", NVFP4_RECIPE, "200KB"),  # linear attention, shared experts, the MTP layer
    ("qwen3_next", RECIPE, "300KB"),  # the study's W4A16: INT4 g128 experts, INT8 per-channel linear attention
    ("qwen3_moe", RECIPE, "300KB"),
    ("qwen3", "build/recipes/dense-27b-4xL4.toml", "400KB"),  # dense MLPs in NVFP4 and FP8 by layer range
    ("qwen3_moe", "static", "150KB"),  # W4A4 and static FP8: input scales, unrouted experts, KV-cache scales
])
def test_files_equal_compressed_tensors_own_converter_byte_for_byte(tmp_path, arch, recipe, shard):
    """The whole output against the library's converter driving its own compressors tensor by tensor (the path
    build.quantize took before its NVFP4 loops): the same files, every one byte for byte (shards, index, config.json,
    tokenizer files), and the same report but for the relative errors' last digits (float32 against bfloat16)."""
    import random

    source = make_checkpoint(tmp_path / "model", arch, seed=0, max_shard_size=shard,
                             widths=GROUPS_OF_128 if recipe == RECIPE else None)
    shard_of = json.loads((source / "model.safetensors.index.json").read_text())["weight_map"]
    if arch == "qwen3_moe" and recipe != "static":  # a fused group whose members lie in two shards travels
        assert any(shard_of[n] != shard_of[n.replace("gate_proj", "up_proj")] for n in shard_of if "gate_proj" in n)
    kv = amax = None
    if recipe == "static":
        recipe = tmp_path / "static.toml"
        recipe.write_text(STATIC_RECIPE)
        rng = random.Random(0)
        amax = {n[:-len(".weight")]: rng.uniform(0.5, 4.0) for n in shard_of
                if n.endswith(".weight") and ".experts.1." not in n}  # expert 1 never routed: it borrows
        kv = {f"model.layers.{i}.self_attn.{k}": rng.uniform(0.01, 1.0) for i in range(2) for k in ("k_scale", "v_scale")}
    ours = quantize(source, recipe, tmp_path / "ours", kv, amax)
    theirs = reference_quantize(source, recipe, tmp_path / "theirs", kv, amax)
    files = sorted(p.relative_to(tmp_path / "theirs").as_posix() for p in (tmp_path / "theirs").rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(tmp_path / "ours").as_posix() for p in (tmp_path / "ours").rglob("*")
                           if p.is_file())
    assert sum(f.endswith(".safetensors") for f in files) > 2
    differing = [f for f in files if f != "quantization_report.json"
                 and (tmp_path / "ours" / f).read_bytes() != (tmp_path / "theirs" / f).read_bytes()]
    assert differing == []
    assert {m: (r["scheme"], r.get("input_scale_from")) for m, r in ours.items()} == {
        m: (r["scheme"], r.get("input_scale_from")) for m, r in theirs.items()}
    assert all(abs(ours[m]["relative_error"] - theirs[m]["relative_error"]) < 1e-3 for m in theirs)
    if kv:
        assert any(r.get("input_scale_from") for r in ours.values())


def test_a_quantised_source_or_a_nan_weight_is_refused(tmp_path):
    from safetensors.torch import load_file, save_file

    source = make_checkpoint(tmp_path / "model", "qwen3_moe", seed=0)
    quantize(source, NVFP4_RECIPE, tmp_path / "q", report=False)
    with pytest.raises(ValueError, match=r"q/config.json: quantization_config is set"):
        quantize(tmp_path / "q", NVFP4_RECIPE, tmp_path / "qq")
    shard = next(source.glob("*.safetensors"))
    tensors = load_file(shard)
    name = "model.layers.1.mlp.experts.2.down_proj.weight"
    tensors[name][3, 5] = float("nan")
    save_file(tensors, shard)
    with pytest.raises(ValueError, match=r"hold NaN or infinite values, e.g. \['model.layers.1.mlp.experts.2.down_proj"):
        quantize(source, NVFP4_RECIPE, tmp_path / "nan")
    assert not (tmp_path / "nan").exists()


def reference_int(w: torch.Tensor, bits: int, group: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric INT weights from their definition, independent of the library: a scale per group of `group` inputs
    (per row when None) of amax / ((2^bits - 1) / 2), rounded to bfloat16; values round-half-even(w / scale) clamped to
    [-2^(bits-1), 2^(bits-1) - 1], stored with 2^(bits-1) added, 32 / bits of them a little-endian int32 word, element
    i of a row in bits [bits * (i mod 32/bits), ...) of word i div (32/bits) (vLLM's uint4b8 / uint8b128). An all-zero
    group stores float32's eps as its scale (the library's guard against dividing by zero, made before the scale is
    rounded to bfloat16) and zeros."""
    w = w.float()
    parts = w.reshape(w.shape[0], -1, group or w.shape[1])
    scale = (parts.abs().amax(-1) / ((2 ** bits - 1) / 2)).to(torch.bfloat16)
    scale[scale == 0] = torch.finfo(torch.float32).eps
    q = torch.round(parts / scale.float()[..., None]).clamp(-2 ** (bits - 1), 2 ** (bits - 1) - 1).reshape(w.shape)
    unsigned = (q.to(torch.int64) + 2 ** (bits - 1)).reshape(w.shape[0], -1, 32 // bits)
    words = (unsigned << (torch.arange(32 // bits) * bits)).sum(-1)
    return (words - (words >= 2 ** 31) * 2 ** 32).to(torch.int32), scale


@pytest.mark.parametrize("scheme, bits, group", [("W4A16", 4, 128), ("W8A16_CHANNEL", 8, None)])
def test_int_weights_match_the_format_definition_byte_for_byte(scheme, bits, group):
    from build.quantize.quantizer import int_weights

    torch.manual_seed(2)
    w = torch.randn(48, 256) * torch.logspace(-3, 0, 48)[:, None]
    w[0, :128] = 0.0  # a zero group: the library's eps scale, every value 0
    w[1, 5] = w[1, :128].abs().max() * 1.0001  # ties and the clamp at the range's edge
    out = int_weights({"m.up_proj": w.to(torch.bfloat16)}, scheme)
    packed, scale = reference_int(w.to(torch.bfloat16), bits, group)
    assert out["m.up_proj.weight_packed"].dtype == torch.int32 and out["m.up_proj.weight_scale"].dtype == torch.bfloat16
    assert torch.equal(out["m.up_proj.weight_packed"], packed)
    assert torch.equal(out["m.up_proj.weight_scale"], scale)
    assert out["m.up_proj.weight_shape"].tolist() == [48, 256]
    restored = dequantize(out, "m.up_proj", scheme).float()
    assert 0 < (restored - w).norm() / w.norm() < (0.15 if bits == 4 else 0.01)


def test_the_study_recipe_writes_w4a16_experts_int8_linear_attention_and_keeps_the_rest(tmp_path, read_tensors):
    """moe-4xL4 on a tiny Qwen3-Next (with its MTP layer): INT4 g128 routed experts, INT8 per-channel Gated DeltaNet
    projections, everything else (full attention, shared experts, routers, norms, output head) untouched BF16; one
    pack-quantized format, the groups vLLM 0.33 reads (tests/w4a16_quantization_config.json, parsed by vLLM itself in
    tests/test_w4a16_vllm.py); a lm_head rule beside MTP weights is refused (vLLM builds the heads unquantised)."""
    from test_prune import add_mtp_shard  # tests/ is on the path

    source = make_checkpoint(tmp_path / "model", "qwen3_next", seed=0, max_shard_size="300KB", widths=GROUPS_OF_128)
    add_mtp_shard(source)
    quantize(source, RECIPE, tmp_path / "q", report=False)
    before, after = read_tensors(source), read_tensors(tmp_path / "q")
    for prefix in ("model.layers.1.mlp.experts.3.down_proj", "mtp.layers.0.mlp.experts.2.gate_proj"):
        assert after[f"{prefix}.weight_packed"].dtype == torch.int32 and f"{prefix}.weight" not in after
        rows, cols = before[f"{prefix}.weight"].shape
        assert after[f"{prefix}.weight_scale"].shape == (rows, cols // 128)
    attn = "model.layers.0.linear_attn.in_proj_qkvz"
    assert after[f"{attn}.weight_scale"].shape == (before[f"{attn}.weight"].shape[0], 1)
    assert after[f"{attn}.weight_packed"].shape[1] == before[f"{attn}.weight"].shape[1] // 4
    plain = [n for n in before if n in after]
    assert all(torch.equal(after[n], before[n]) for n in plain)
    assert {"lm_head.weight", "model.layers.1.self_attn.q_proj.weight", "model.layers.0.mlp.gate.weight",
            "model.layers.0.mlp.shared_expert.up_proj.weight", "model.layers.0.mlp.shared_expert_gate.weight",
            "mtp.layers.0.mlp.gate.weight"} <= set(plain)
    config = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]
    assert config["format"] == "pack-quantized"
    by_bits = {g["weights"]["num_bits"]: g for g in config["config_groups"].values()}
    assert (by_bits[4]["weights"]["strategy"], by_bits[4]["weights"]["group_size"], by_bits[4]["weights"]["symmetric"]
            ) == ("group", 128, True)
    assert (by_bits[8]["weights"]["strategy"], by_bits[8]["weights"]["symmetric"]) == ("channel", True)
    assert all(".experts." in t for t in by_bits[4]["targets"])
    assert all(".linear_attn." in t for t in by_bits[8]["targets"])
    assert all(g.get("input_activations") is None for g in config["config_groups"].values())
    shape = {k: v for k, v in config.items() if k not in ("config_groups", "version")}
    shape["config_groups"] = {k: dict(g, targets=sorted({t.split(".")[-1] for t in g["targets"]}))
                              for k, g in config["config_groups"].items()}
    assert shape == json.loads(VLLM_CONFIG.read_text()), f"update {VLLM_CONFIG.name} and rerun test_w4a16_vllm.py"
    (tmp_path / "head.toml").write_text(RECIPE_TEXT_WITH_HEAD)
    with pytest.raises(ValueError, match="quantises lm_head, but .* has MTP weights"):
        quantize(source, tmp_path / "head.toml", tmp_path / "qh")


RECIPE_TEXT_WITH_HEAD = """[[rules]]
pattern = '^lm_head$'
scheme = "W8A16_CHANNEL"
"""


def test_w4a16_refuses_inputs_that_do_not_fill_groups_of_128(tmp_path):
    source = make_checkpoint(tmp_path / "model", "qwen3_moe", seed=0)  # moe_intermediate_size 64: down_proj's inputs
    with pytest.raises(ValueError, match=r"W4A16 needs input widths that are multiples of 128.*down_proj of width 64"):
        quantize(source, RECIPE, tmp_path / "q")
    assert not (tmp_path / "q").exists() and not (tmp_path / "q.partial").exists()
