"""Expert pruning on tiny sharded Qwen3-MoE and Qwen3-Next checkpoints: the pruned model equals the original with the
dropped experts' router logits at minus infinity, kept experts are bit-identical, bad lists are refused, and pruning a
quantised (W4A16 or NVFP4) checkpoint writes what quantising the pruned BF16 one writes.
Needs the build environment (compressed-tensors' converter; make build-env); skipped elsewhere."""

from __future__ import annotations

import json
import random
import re
import shutil
from pathlib import Path

import pytest

pytest.importorskip("compressed_tensors.entrypoints.convert.converters.magnitude_expert_pruner",
                    reason="pruning needs the build environment (make build-env)")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from build.models.tiny import make_checkpoint  # noqa: E402
from build.prune.pruner import PruneError, prune  # noqa: E402

EXPERTS, KEEP = 8, 4


@pytest.fixture(scope="module", params=["qwen3_moe", "qwen3_next"])
def checkpoint(request, tmp_path_factory):
    folder = tmp_path_factory.mktemp(request.param)
    return make_checkpoint(folder / "model", request.param, seed=0, max_shard_size="300KB")


def masked(model, kept: list[list[int]]):
    """The original model with each router's dropped experts at minus infinity (the equivalence pruning keeps)."""
    routers = [m for name, m in model.named_modules() if name.endswith("mlp.gate")]
    for router, keep in zip(routers, kept):
        mask = torch.full((router.num_experts,), float("-inf"))
        mask[keep] = 0.0

        def forward(hidden, router=router, mask=mask):
            logits = torch.nn.functional.linear(hidden.reshape(-1, router.hidden_dim), router.weight) + mask
            probs = torch.softmax(logits, dtype=torch.float, dim=-1)
            top, index = torch.topk(probs, router.top_k, dim=-1)
            if router.norm_topk_prob:
                top /= top.sum(dim=-1, keepdim=True)
            return logits, top.to(logits.dtype), index

        router.forward = forward
    return model


def test_pruned_checkpoint_equals_the_masked_original(checkpoint, tmp_path, read_tensors):
    rng = random.Random(1)
    config = json.loads((checkpoint / "config.json").read_text())
    layers = config["num_hidden_layers"]
    kept = [sorted(rng.sample(range(EXPERTS), KEEP)) for _ in range(layers)]
    (tmp_path / "list.json").write_text(json.dumps({"name": "random4", "experts": kept}))
    out = prune(checkpoint, tmp_path / "list.json", tmp_path / "pruned")
    assert not (tmp_path / "pruned.partial").exists() and (out / "pruning.json").exists()
    pruned_config = json.loads((out / "config.json").read_text())
    key = "num_local_experts" if "num_local_experts" in pruned_config else "num_experts"
    assert pruned_config[key] == KEEP

    before, after = read_tensors(checkpoint), read_tensors(out)
    for layer, keep in enumerate(kept):
        prefix = f"model.layers.{layer}.mlp"
        assert torch.equal(after[f"{prefix}.gate.weight"], before[f"{prefix}.gate.weight"][keep])
        for new, old in enumerate(keep):
            for proj in ("gate_proj", "up_proj", "down_proj"):
                assert torch.equal(after[f"{prefix}.experts.{new}.{proj}.weight"],
                                   before[f"{prefix}.experts.{old}.{proj}.weight"])
        assert f"{prefix}.experts.{KEEP}.gate_proj.weight" not in after

    ids = torch.randint(0, config["vocab_size"], (2, 24), generator=torch.Generator().manual_seed(0))
    original = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    small = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    with torch.no_grad():
        plain = original(ids).logits
        reference = masked(original, kept)(ids).logits
        got = small(ids).logits
    assert torch.allclose(got, reference, atol=1e-5, rtol=1e-5)
    assert not torch.allclose(got, plain, atol=1e-3)  # the mask matters: the check can fail


@pytest.mark.parametrize("experts, message", [
    ([[0, 1, 2, 3], [0, 1, 2]], "unequal expert counts"),
    ([[0, 1, 2, 2], [0, 1, 2, 3]], "twice"),
    ([[0, 1, 2, 9], [0, 1, 2, 3]], "outside 0..7"),
    ([[0, 1, 2, 3]], "1 layers in the list"),
    ([[0], [1]], "routed to per token"),
])
def test_bad_lists_are_refused_before_any_work(checkpoint, tmp_path, experts, message):
    (tmp_path / "bad.json").write_text(json.dumps({"experts": experts}))
    with pytest.raises(PruneError, match=message):
        prune(checkpoint, tmp_path / "bad.json", tmp_path / "out")
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.partial").exists()


def add_mtp_shard(folder):
    """An MTP layer (mtp.*, loaded by vLLM only) as Qwen3-Next releases carry: a MoE of the same expert count, in a
    shard of its own. Its router's row norms grow with the index (the top 4 are 4..7); expert e's weights are all e."""
    from safetensors.torch import save_file

    config = json.loads((folder / "config.json").read_text())
    hidden, inter = config["hidden_size"], config["moe_intermediate_size"]
    gen = torch.Generator().manual_seed(3)
    mtp = {"mtp.layers.0.mlp.gate.weight": torch.randn(EXPERTS, hidden, generator=gen) *
           torch.arange(1, EXPERTS + 1)[:, None]}
    for e in range(EXPERTS):
        mtp[f"mtp.layers.0.mlp.experts.{e}.gate_proj.weight"] = torch.full((inter, hidden), float(e))
        mtp[f"mtp.layers.0.mlp.experts.{e}.up_proj.weight"] = torch.full((inter, hidden), float(e))
        mtp[f"mtp.layers.0.mlp.experts.{e}.down_proj.weight"] = torch.full((hidden, inter), float(e))
    save_file({k: v.to(torch.bfloat16) for k, v in mtp.items()}, folder / "mtp.safetensors")
    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    index["weight_map"].update({name: "mtp.safetensors" for name in mtp})
    index_path.write_text(json.dumps(index))
    return config


def test_mtp_layer_keeps_its_largest_router_rows(tmp_path_factory, read_tensors):
    folder = make_checkpoint(tmp_path_factory.mktemp("mtp") / "model", "qwen3_next", seed=0, max_shard_size="300KB")
    config = add_mtp_shard(folder)
    kept = [[0, 1, 2, 3]] * config["num_hidden_layers"]
    (folder.parent / "list.json").write_text(json.dumps({"experts": kept}))
    out = prune(folder, folder.parent / "list.json", folder.parent / "pruned")
    after = read_tensors(out)
    assert [after[f"mtp.layers.0.mlp.experts.{j}.gate_proj.weight"][0, 0].item() for j in range(KEEP)] == [4, 5, 6, 7]
    assert after["mtp.layers.0.mlp.gate.weight"].shape[0] == KEEP
    assert "mtp.layers.0.mlp.experts.4.gate_proj.weight" not in after


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_next"])
def test_files_equal_the_library_converters_byte_for_byte(arch, tmp_path):
    """build.prune hands kept tensors' bytes from the mapped source to safetensors' serialiser; the reference is
    compressed-tensors' own streaming converter (convert_checkpoint + MagnitudeExpertPruner, which loads, slices and
    saves every tensor) with the same kept experts: every file it writes is equal byte for byte (MTP shard included)."""
    from compressed_tensors.entrypoints.convert import convert_checkpoint
    from compressed_tensors.entrypoints.convert.converters.magnitude_expert_pruner import MagnitudeExpertPruner
    from compressed_tensors.utils.moe import extract_expert_index

    from build.prune.pruner import EXPERT, MTP_ROUTER, ROUTER, expert_to_router, set_expert_count

    folder = make_checkpoint(tmp_path / "model", arch, seed=0, max_shard_size="300KB")
    if arch == "qwen3_next":
        add_mtp_shard(folder)
    config = json.loads((folder / "config.json").read_text())
    rng = random.Random(2)
    kept = [sorted(rng.sample(range(EXPERTS), KEEP)) for _ in range(config["num_hidden_layers"])]
    (tmp_path / "list.json").write_text(json.dumps({"experts": kept}))
    out = prune(folder, tmp_path / "list.json", tmp_path / "pruned")

    retained = json.loads((out / "pruning.json").read_text())["kept"]
    names = list(json.loads((folder / "model.safetensors.index.json").read_text())["weight_map"])
    experts = [n for n in names if re.search(EXPERT, n)]
    key = "num_local_experts" if "num_local_experts" in config else "num_experts"
    reference = MagnitudeExpertPruner(
        router_pattern="|".join([ROUTER, MTP_ROUTER]), expert_pattern=EXPERT, sparsity=1 - KEEP / EXPERTS,
        num_experts_config_key=key, retained_experts=retained,
        expert_to_router=expert_to_router(experts, set(retained), "reference"),
        expert_indices={n: extract_expert_index(n) for n in experts}, is_3d=False,
        num_experts_per_tok=config["num_experts_per_tok"])
    convert_checkpoint(str(folder), str(tmp_path / "reference"), converter=reference, max_workers=1, device="cpu")
    written = tmp_path / "reference" / "config.json"
    written.write_text(json.dumps(set_expert_count(json.loads(written.read_text()), KEEP), indent=2))
    files = sorted(p.relative_to(tmp_path / "reference") for p in (tmp_path / "reference").rglob("*") if p.is_file())
    assert sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file()) == sorted([*files, Path("pruning.json")])
    assert sum(f.suffix == ".safetensors" for f in files) > 1
    assert (Path("mtp.safetensors") in files) == (arch == "qwen3_next")
    for name in files:
        assert (out / name).read_bytes() == (tmp_path / "reference" / name).read_bytes(), name


@pytest.mark.parametrize("recipe", ["build/recipes/moe-4xL4.toml", "build/recipes/moe-4xL4-nvfp4.toml"])
def test_pruning_a_quantised_checkpoint_equals_quantising_the_pruned_one(recipe, tmp_path):
    """A team downloads the W4A16 checkpoint, not BF16: pruning it (every part of a dropped expert, the router rows,
    the quantization_config's expert names, the report's rows) writes what pruning the BF16 checkpoint and then
    quantising writes: every shard byte for byte, the same config.json, index and report. On a tiny Qwen3-Next with
    its MTP layer (experts 128 wide, W4A16's groups of 128), for the study's recipe and the kit's NVFP4 one."""
    from safetensors import safe_open

    from build.quantize.quantizer import quantize

    source = make_checkpoint(tmp_path / "model", "qwen3_next", seed=0, max_shard_size="300KB",
                             widths={"moe_intermediate_size": 128})
    config = add_mtp_shard(source)
    rng = random.Random(4)
    kept = [sorted(rng.sample(range(EXPERTS), KEEP)) for _ in range(config["num_hidden_layers"])]
    (tmp_path / "list.json").write_text(json.dumps({"name": "random4", "experts": kept}))
    quantize(source, recipe, tmp_path / "quantised")
    ours = prune(tmp_path / "quantised", tmp_path / "list.json", tmp_path / "ours")
    theirs = tmp_path / "theirs"
    quantize(prune(source, tmp_path / "list.json", tmp_path / "pruned"), recipe, theirs)

    files = sorted(p.relative_to(theirs).as_posix() for p in theirs.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(ours).as_posix() for p in ours.rglob("*") if p.is_file())
    shards = [f for f in files if f.endswith(".safetensors")]
    assert len(shards) > 2 and "mtp.safetensors" in shards
    for name in shards:
        assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name
    for name in ("config.json", "model.safetensors.index.json"):
        assert json.loads((ours / name).read_text()) == json.loads((theirs / name).read_text()), name
    report = {name: json.loads((folder / "quantization_report.json").read_text())["tensors"] for name, folder in
              (("ours", ours), ("theirs", theirs))}
    assert report["ours"] == report["theirs"]
    for name in files:
        if not name.endswith(".safetensors") and name not in ("config.json", "model.safetensors.index.json",
                                                              "quantization_report.json", "pruning.json"):
            assert (ours / name).read_bytes() == (theirs / name).read_bytes(), name

    with safe_open(ours / "mtp.safetensors", framework="pt") as f:  # every part of a dropped expert went
        names = set(f.keys())
    parts = {n.rpartition(".")[2] for n in names if ".experts.0.up_proj." in n}
    assert len(parts) >= 3 and not any(f".experts.{KEEP}." in n for n in names)
    groups = json.loads((ours / "config.json").read_text())["quantization_config"]["config_groups"]
    targets = [t for group in groups.values() for t in group["targets"]]
    assert not any(f".experts.{KEEP}." in t for t in targets) and any(".experts.3.down_proj" in t for t in targets)


def test_every_part_of_an_expert_follows_it_and_the_config_names_too():
    """Asymmetric and act-order checkpoints carry more parts per expert (`weight_zero_point`, `weight_g_idx`): all go
    or are renumbered with the expert; the quantization_config's explicit names follow, its patterns stay."""
    from build.prune.pruner import kept_tensors, module_renames, pruned_quantization_config

    parts = ("weight_packed", "weight_scale", "weight_shape", "weight_zero_point", "weight_g_idx")
    names = ["model.layers.0.mlp.gate.weight"] + [f"model.layers.0.mlp.experts.{e}.up_proj.{part}"
                                                   for e in range(4) for part in parts]
    kept = kept_tensors(names, {"model.layers.0.mlp.gate.weight": [1, 3]}, "test")
    expert = "model.layers.0.mlp.experts.{}.up_proj.{}"
    assert kept == {"model.layers.0.mlp.gate.weight": "model.layers.0.mlp.gate.weight",
                    **{expert.format(old, part): expert.format(new, part) for new, old in enumerate([1, 3])
                       for part in parts}}
    modules, gone = module_renames(kept, set(names) - set(kept))
    config = {"quant_method": "compressed-tensors", "format": "pack-quantized", "ignore": ["lm_head"],
              "config_groups": {"group_0": {"targets": [f"model.layers.0.mlp.experts.{e}.up_proj" for e in range(4)]},
                                "group_1": {"targets": ["re:.*linear_attn.*"]}}}
    pruned = pruned_quantization_config(config, modules, gone)
    assert pruned["config_groups"]["group_0"]["targets"] == ["model.layers.0.mlp.experts.0.up_proj",
                                                             "model.layers.0.mlp.experts.1.up_proj"]
    assert pruned["config_groups"]["group_1"] == config["config_groups"]["group_1"] and pruned["ignore"] == ["lm_head"]


def test_a_quantised_source_is_refused(checkpoint, tmp_path):
    """A checkpoint quantised by another method than compressed-tensors (whose tensor names are not known here)."""
    source = tmp_path / "model"
    shutil.copytree(checkpoint, source)
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(json.dumps(dict(config, quantization_config={"quant_method": "fp8"})))
    (tmp_path / "list.json").write_text(json.dumps({"experts": [[0, 1, 2, 3]] * config["num_hidden_layers"]}))
    with pytest.raises(PruneError, match="quantization_config"):
        prune(source, tmp_path / "list.json", tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_every_expert_count_key_is_rewritten(tmp_path):
    """A config with both `num_experts` and `num_local_experts` (Qwen3-MoE writes the second, releases the first):
    both get the new count, and transformers loads the pruned checkpoint."""
    folder = make_checkpoint(tmp_path / "model", "qwen3_moe", seed=0, max_shard_size="300KB")
    config_path = folder / "config.json"
    config = json.loads(config_path.read_text())
    config["num_experts"] = config["num_local_experts"] = EXPERTS
    config_path.write_text(json.dumps(config))
    (tmp_path / "list.json").write_text(json.dumps({"experts": [[0, 2, 4, 6]] * config["num_hidden_layers"]}))
    out = prune(folder, tmp_path / "list.json", tmp_path / "pruned")
    pruned = json.loads((out / "config.json").read_text())
    assert pruned["num_experts"] == KEEP and pruned["num_local_experts"] == KEEP
    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32)
    assert model.model.layers[0].mlp.experts.num_experts == KEEP
