"""build/ at the scale of the real checkpoints: the full Qwen3-Next-80B topology at tiny widths (48 layers x 512
experts x 3 projections plus the MTP layer, ~76k tensors in 41 shards, made once for this module) through calibrate,
prune, quantise and the likelihood check with one decoder layer resident (the end-of-turn patch streams as prune does;
`make prune-demo TOPOLOGY=qwen3-next-80b` runs it at this scale). Needs the build environment (make build-env)."""

from __future__ import annotations

import json
import random
import re

import numpy as np
import pytest

pytest.importorskip("compressed_tensors.entrypoints.convert.converters.magnitude_expert_pruner",
                    reason="needs the build environment (make build-env)")

import torch  # noqa: E402

from build.models.topology import TOPOLOGIES, TINY_WIDTHS, write_topology  # noqa: E402

LAYERS, EXPERTS, KEEP = 48, 512, 384


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def next80b(tmp_path_factory):
    return write_topology(tmp_path_factory.mktemp("next80b") / "model", "qwen3-next-80b", seed=0)


@pytest.fixture(scope="module")
def weight_map(next80b):
    return json.loads((next80b / "model.safetensors.index.json").read_text())["weight_map"]


def traces(n: int, vocab: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p, t, a = 12, 40, 10
        out.append({"task_id": f"task{i}", "token_ids": [rng.randrange(vocab) for _ in range(p + t + a)],
                    "segments": {"prompt": [0, p], "thinking": [p, p + t], "answer": [p + t, p + t + a]},
                    "program": [p + t + 2, p + t + a]})
    return out


def test_topology_is_the_releases(next80b, weight_map):
    """The written config is the release's, every key, except the tiny widths and the vocabulary and token ids of
    the kit tokenizer written beside it (which the model must agree with)."""
    from transformers import AutoTokenizer

    config = json.loads((next80b / "config.json").read_text())
    published = TOPOLOGIES["qwen3-next-80b"].config
    tokenizer = AutoTokenizer.from_pretrained(next80b)
    kit = {"vocab_size": len(tokenizer), "eos_token_id": tokenizer.convert_tokens_to_ids("<|im_end|>"),
           "pad_token_id": tokenizer.convert_tokens_to_ids("<|endoftext|>"), "bos_token_id": None}
    assert config == {**published, **{k: v for k, v in TINY_WIDTHS.items() if k in published}, **kit}
    assert (config["num_hidden_layers"], config["num_experts"], config["hidden_size"]) == (LAYERS, EXPERTS, 32)
    assert sorted(p.name for p in next80b.glob("*.safetensors")) == [
        f"model-{i:05d}-of-00041.safetensors" for i in range(1, 42)]
    experts = [n for n in weight_map if re.search(r"\.mlp\.experts\.\d+\.", n)]
    assert len(experts) == (LAYERS + 1) * EXPERTS * 3  # the MTP layer is a MoE of the same count
    assert len(weight_map) > 75_000
    full = [i for i in range(LAYERS) if f"model.layers.{i}.self_attn.q_proj.weight" in weight_map]
    assert full == list(range(3, LAYERS, 4))  # full attention every 4th layer, linear attention elsewhere
    assert "model.layers.0.linear_attn.in_proj_qkvz.weight" in weight_map
    for name in ("mtp.fc.weight", "mtp.norm.weight", "mtp.pre_fc_norm_embedding.weight",
                 "mtp.pre_fc_norm_hidden.weight", "mtp.layers.0.self_attn.q_proj.weight",
                 "mtp.layers.0.mlp.shared_expert_gate.weight",
                 f"mtp.layers.0.mlp.experts.{EXPERTS - 1}.down_proj.weight"):
        assert name in weight_map, name


def test_dense_topology_loads_in_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    folder = write_topology(tmp_path / "32b", "qwen3-32b")
    model, info = AutoModelForCausalLM.from_pretrained(folder, output_loading_info=True)
    assert model.config.num_hidden_layers == 64 and len(list(folder.glob("*.safetensors"))) == 17
    assert not info["missing_keys"] and not info["unexpected_keys"]


def test_calibrate_with_one_layer_resident(next80b, weight_map, tmp_path):
    """Statistics over all 48 MoE layers while at most one decoder layer's weights (plus the embedding and the final
    norm) are ever resident."""
    from build.prune.calibrate import calibrate

    resident = []
    vocab = json.loads((next80b / "config.json").read_text())["vocab_size"]
    stats = calibrate(next80b, traces(2, vocab), tmp_path / "stats.npz", on_step=lambda s: resident.append(s))
    assert stats.counts.shape == (2, 8, LAYERS, EXPERTS) and stats.mtp_router_norms.shape == (1, EXPERTS)
    assert np.array_equal(stats.counts.sum(axis=(1, 3)), np.full((2, LAYERS), 62 * 10))  # tokens x top-10
    assert len(resident) == LAYERS
    assert_one_layer_resident(next80b, weight_map, resident)


def assert_one_layer_resident(folder, weight_map, steps) -> None:
    """At most the embedding, the final norm and the largest decoder layer (in float32) were ever resident, and
    some layer was."""
    from safetensors import safe_open

    def layer_bytes(prefix: str) -> int:
        total = 0
        for name, file in weight_map.items():
            if name.startswith(prefix):
                with safe_open(folder / file, framework="pt") as f:
                    total += int(np.prod(f.get_slice(name).get_shape())) * 4  # float32 in memory
        return total

    fixed = layer_bytes("model.embed_tokens.") + layer_bytes("model.norm.")
    largest = max(layer_bytes(f"model.layers.{i}.") for i in (0, 3))  # a linear- and a full-attention layer
    assert max(s.resident_bytes for s in steps) <= fixed + largest
    assert max(s.resident_bytes for s in steps) > fixed  # a layer was loaded


@pytest.mark.timeout(900)  # three passes over 76k tensors: ~3 minutes on this shared machine under load
def test_prune_quantise_check_on_the_80b_topology(next80b, tmp_path, read_tensors):
    from safetensors import safe_open

    from build.check_quality import compare
    from build.prune.pruner import prune
    from build.quantize.quantizer import quantize

    rng = random.Random(0)
    (tmp_path / "list.json").write_text(json.dumps({"experts": [sorted(rng.sample(range(EXPERTS), KEEP))
                                                                for _ in range(LAYERS)]}))
    pruned = prune(next80b, tmp_path / "list.json", tmp_path / "pruned")
    config = json.loads((pruned / "config.json").read_text())
    assert config["num_experts"] == KEEP
    index = json.loads((pruned / "model.safetensors.index.json").read_text())["weight_map"]
    assert sum(1 for n in index if re.search(r"\.experts\.\d+\.", n)) == (LAYERS + 1) * KEEP * 3

    # every tensor passes through the converter; the experts of the last layer and of the MTP layer are quantised
    # (the compressor costs ~1 ms per tensor at any width: all 56k experts take minutes; the benchmark does that)
    recipe = tmp_path / "recipe.toml"
    recipe.write_text(r"""
[[rules]]
pattern = '\.mlp\.experts\.\d+\.(gate|up|down)_proj$'
layers = [47, 47]
scheme = "NVFP4A16"

[[rules]]
pattern = '^mtp\.layers\.0\.mlp\.experts\.'
scheme = "NVFP4A16"

[[rules]]
pattern = '\.self_attn\.(q|k|v|o)_proj$'
scheme = "FP8_DYNAMIC"
""")
    quantize(pruned, recipe, tmp_path / "q", report=False)
    groups = json.loads((tmp_path / "q" / "config.json").read_text())["quantization_config"]["config_groups"]
    targets = {t: g["weights"]["num_bits"] for g in groups.values() for t in g["targets"]}
    for layer in ("model.layers.47", "mtp.layers.0"):  # vLLM reads expert 0's scheme
        assert targets[f"{layer}.mlp.experts.0.gate_proj"] == 4
    assert "model.layers.46.mlp.experts.0.gate_proj" not in targets
    assert targets["mtp.layers.0.self_attn.q_proj"] == 8
    assert "lm_head" not in targets and "mtp.fc" not in targets  # as vLLM's MTP loader builds them
    q_index = json.loads((tmp_path / "q" / "model.safetensors.index.json").read_text())["weight_map"]
    with safe_open(tmp_path / "q" / q_index["mtp.layers.0.mlp.experts.5.up_proj.weight_global_scale"],
                   framework="pt") as f:
        up = f.get_tensor("mtp.layers.0.mlp.experts.5.up_proj.weight_global_scale")
    with safe_open(tmp_path / "q" / q_index["mtp.layers.0.mlp.experts.5.gate_proj.weight_global_scale"],
                   framework="pt") as f:
        assert torch.equal(f.get_tensor("mtp.layers.0.mlp.experts.5.gate_proj.weight_global_scale"), up)

    vocab = config["vocab_size"]
    quality = compare(pruned, tmp_path / "q", traces(1, vocab, seed=3))
    assert np.isfinite(quality.difference) and quality.nll_candidate != quality.nll_reference


def test_quantising_lm_head_beside_mtp_is_refused(next80b, tmp_path):
    from build.quantize.quantizer import quantize

    recipe = tmp_path / "head.toml"
    recipe.write_text('[[rules]]\npattern = "^lm_head$"\nscheme = "FP8_DYNAMIC"\n')
    with pytest.raises(ValueError, match="quantises lm_head, but .* has MTP weights"):
        quantize(next80b, recipe, tmp_path / "q")
    assert not (tmp_path / "q.partial").exists()


def test_scale_calibration_with_one_layer_resident(tmp_path):
    """The FP8 KV-cache and static input scales observed with one decoder layer resident at a time, on the 80B
    topology cut to 8 layers (512 experts each; the bound is per layer, and 8 layers keep it to seconds: the
    48-layer pass is benchmarks/build_scale.py's `scales` step, with its peak RSS)."""
    from build.quantize.activations import activation_amax

    layers = 8
    folder = write_topology(tmp_path / "model", "qwen3-next-80b", seed=0, layers=layers)
    weight_map = json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"]
    vocab = json.loads((folder / "config.json").read_text())["vocab_size"]
    resident = []
    found = activation_amax(folder, [t["token_ids"] for t in traces(2, vocab, seed=1)], on_step=resident.append)
    assert len(resident) == layers
    assert_one_layer_resident(folder, weight_map, resident)
    assert sorted(found.kv) == [f"model.layers.{i}.self_attn" for i in (3, 7)]  # full attention every 4th layer
    assert all(k > 0 and v > 0 for k, v in found.kv.values())
    routed = {int(n.split(".")[2]) for n in found.inputs if ".mlp.experts." in n}
    assert routed == set(range(layers)) and found.inputs["lm_head"] > 0
    assert not any(n.startswith("mtp.") for n in found.inputs)  # transformers' model has no MTP layer


def test_bundle_of_the_80b_topology(next80b, weight_map, tmp_path):
    """build.bundle on the 76k-tensor checkpoint: every shard in the manifest with the source's own checksum, every
    tensor of the index in the bundled shards, and a changed byte in one of 41 shards is named by verify."""
    from safetensors import safe_open

    from build.bundle.bundler import bundle, verify
    from offline_wheels.lock import sha256

    dataset = bundle("moe-4xL4", next80b, tmp_path / "dataset", target="cpu-py311")
    assert verify(dataset) == []
    files = json.loads((dataset / "manifest.json").read_text())["files"]
    shards = sorted(p.name for p in next80b.iterdir())
    assert sorted(name[len("model/"):] for name in files if name.startswith("model/")) == shards
    for name in shards:
        assert files[f"model/{name}"]["sha256"] == sha256(next80b / name), name
    index = json.loads((dataset / "model" / "model.safetensors.index.json").read_text())["weight_map"]
    assert index == weight_map
    found = {}
    for shard in sorted((dataset / "model").glob("*.safetensors")):
        with safe_open(shard, framework="pt") as f:
            found.update({name: shard.name for name in f.keys()})
    assert found == weight_map and len(found) > 75_000

    victim = dataset / "model" / "model-00020-of-00041.safetensors"
    data = bytearray(victim.read_bytes())
    data[-1] ^= 1
    victim.write_bytes(bytes(data))
    assert verify(dataset) == ["sha256 differs: model/model-00020-of-00041.safetensors"]


def test_split_parts_are_copied_in_bounded_blocks(tmp_path):
    """A file split into parts is copied a block at a time: memory stays at the block, not the part (the parts of a
    real bundle are up to 20 GiB)."""
    import tracemalloc

    from build.bundle.bundler import PART, _split

    data = random.Random(0).randbytes(3 << 20)
    (tmp_path / "shard").write_bytes(data)
    tracemalloc.start()
    _split(tmp_path / "shard", limit=1 << 20, block=64 << 10)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    parts = sorted(tmp_path.glob(f"shard{PART}*"))
    assert [p.name for p in parts] == [f"shard{PART}{i:03d}" for i in range(3)] and not (tmp_path / "shard").exists()
    assert b"".join(p.read_bytes() for p in parts) == data
    assert peak < 512 << 10  # a 1 MiB part never held whole
