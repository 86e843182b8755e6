"""Full-topology, tiny-width checkpoints: the real model's layer count, expert count, MTP layer, tensor names, shard
count and config keys, with tiny hidden sizes, so every loop of build/ runs over the real number of tensors.

    python -m build.tiny --topology qwen3-next-80b --out DIR [--seed 0]

The published configs below are data, copied from each model's `config.json` on the Hugging Face hub
(Qwen/Qwen3-Next-80B-A3B-Instruct, Qwen/Qwen3-30B-A3B, Qwen/Qwen3-32B, as released in 2025), with the shard count of
the release (`model-000NN-of-000SS.safetensors`); only the width keys (`TINY_WIDTHS`) and the vocabulary (the kit's
own 1,024-token tokenizer, build.tokenizer) are replaced. Tensor names come from transformers itself: a template
model of the same config with a few layers and two experts is saved by `save_pretrained`, and its per-layer names are
repeated for every layer and expert. Qwen3-Next's MTP weights (`mtp.*`, loaded by vLLM only, see
vllm/model_executor/models/qwen3_next_mtp.py) are a full-attention decoder layer under `mtp.layers.0.` plus `mtp.fc`
(2 x hidden -> hidden) and three norms, written into the last shard as in the release. Approximate where the release
is not reproducible: shards are split by tensor count in order, not at the release's exact boundaries, and the
weights are random (1-D tensors keep transformers' initial values).
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from build.tokenizer import make_tokenizer

_COMMON = {"attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645,
           "hidden_act": "silu", "initializer_range": 0.02, "rms_norm_eps": 1e-06, "rope_scaling": None,
           "tie_word_embeddings": False, "torch_dtype": "bfloat16", "use_cache": True, "use_sliding_window": False,
           "vocab_size": 151936}


@dataclass(frozen=True)
class Topology:
    name: str
    source: str  # where the config comes from
    shards: int  # shard count of the release
    config: dict
    mtp_layers: int = 0


TOPOLOGIES = {t.name: t for t in (
    Topology("qwen3-next-80b", "Qwen/Qwen3-Next-80B-A3B-Instruct config.json", 41, {
        **_COMMON, "architectures": ["Qwen3NextForCausalLM"], "model_type": "qwen3_next", "decoder_sparse_step": 1,
        "full_attention_interval": 4, "head_dim": 256, "hidden_size": 2048, "intermediate_size": 5120,
        "linear_conv_kernel_dim": 4, "linear_key_head_dim": 128, "linear_num_key_heads": 16,
        "linear_num_value_heads": 32, "linear_value_head_dim": 128, "max_position_embeddings": 262144,
        "mlp_only_layers": [], "moe_intermediate_size": 512, "norm_topk_prob": True, "num_attention_heads": 16,
        "num_experts": 512, "num_experts_per_tok": 10, "num_hidden_layers": 48, "num_key_value_heads": 2,
        "output_router_logits": False, "partial_rotary_factor": 0.25, "rope_theta": 10000000,
        "router_aux_loss_coef": 0.001, "shared_expert_intermediate_size": 512}, mtp_layers=1),
    Topology("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B config.json", 16, {
        **_COMMON, "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe", "decoder_sparse_step": 1,
        "head_dim": 128, "hidden_size": 2048, "intermediate_size": 6144, "max_position_embeddings": 40960,
        "max_window_layers": 48, "mlp_only_layers": [], "moe_intermediate_size": 768, "norm_topk_prob": True,
        "num_attention_heads": 32, "num_experts": 128, "num_experts_per_tok": 8, "num_hidden_layers": 48,
        "num_key_value_heads": 4, "output_router_logits": False, "rope_theta": 1000000.0,
        "router_aux_loss_coef": 0.001, "sliding_window": None}),
    Topology("qwen3-32b", "Qwen/Qwen3-32B config.json", 17, {
        **_COMMON, "architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "head_dim": 128,
        "hidden_size": 5120, "intermediate_size": 25600, "max_position_embeddings": 40960, "max_window_layers": 64,
        "num_attention_heads": 64, "num_hidden_layers": 64, "num_key_value_heads": 8, "rope_theta": 1000000,
        "sliding_window": None}),
)}

# Widths small enough that 75k tensors take seconds, large enough for NVFP4's 16-wide blocks and a working forward.
TINY_WIDTHS = {"hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16,
               "shared_expert_intermediate_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1,
               "head_dim": 16, "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2,
               "linear_num_value_heads": 4}


def tiny_config(topology: Topology, vocab_size: int, eos_id: int, pad_id: int) -> dict:
    """The published config with tiny widths and the kit tokenizer's vocabulary and ids. Pure."""
    config = dict(topology.config)
    config.update({k: v for k, v in TINY_WIDTHS.items() if k in config})
    config.update(vocab_size=vocab_size, eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None)
    return config


def _template(config: dict, folder: Path) -> dict:
    """Tensors of a model with the same config but one period of layers and two experts, as transformers saves it."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModelForCausalLM

    small = dict(config, num_hidden_layers=config.get("full_attention_interval", 1))
    if "num_experts" in small:
        small.update(num_experts=2, num_experts_per_tok=1)
    model_type = small.pop("model_type")
    model = AutoModelForCausalLM.from_config(AutoConfig.for_model(model_type, **small), dtype=torch.bfloat16)
    model.save_pretrained(folder)
    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def tensor_plan(config: dict, template: dict, mtp_layers: int) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, template name, shape) for every tensor of the full topology, in checkpoint order. Pure."""
    import re

    period = config.get("full_attention_interval", 1)
    experts = config.get("num_experts", 0)
    layer_names: dict[int, list[str]] = {}
    outside = []
    for name in template:
        m = re.match(r"model\.layers\.(\d+)\.(.*)$", name)
        if m:
            layer_names.setdefault(int(m.group(1)), []).append(m.group(2))
        else:
            outside.append(name)

    def layer(index: int, prefix: str) -> list[tuple[str, str, tuple[int, ...]]]:
        rows = []
        names = sorted(layer_names[index])
        expert_leaves = [rest.split(".", 3)[3] for rest in names if rest.startswith("mlp.experts.0.")]
        for rest in names:
            source = f"model.layers.{index}.{rest}"
            shape = tuple(template[source].shape)
            if rest.startswith("mlp.experts."):
                if rest == f"mlp.experts.0.{expert_leaves[0]}":  # expert by expert, as transformers writes them
                    rows += [(f"{prefix}mlp.experts.{e}.{leaf}", f"model.layers.{index}.mlp.experts.0.{leaf}",
                              tuple(template[f"model.layers.{index}.mlp.experts.0.{leaf}"].shape))
                             for e in range(experts) for leaf in expert_leaves]
            elif rest == "mlp.gate.weight":
                rows.append((f"{prefix}{rest}", source, (experts, shape[1])))
            else:
                rows.append((f"{prefix}{rest}", source, shape))
        return rows

    rows = [(n, n, tuple(template[n].shape)) for n in sorted(outside) if n.startswith("model.embed")]
    for index in range(config["num_hidden_layers"]):
        rows += layer(index % period, f"model.layers.{index}.")
    rows += [(n, n, tuple(template[n].shape)) for n in sorted(outside) if not n.startswith("model.embed")]
    hidden = config["hidden_size"]
    for m in range(mtp_layers):  # the template's last layer has full attention (every `period`-th layer does)
        rows += layer(period - 1, f"mtp.layers.{m}.")
    if mtp_layers:
        norm = "model.norm.weight"
        rows += [("mtp.fc.weight", "", (hidden, 2 * hidden)), ("mtp.norm.weight", norm, (hidden,)),
                 ("mtp.pre_fc_norm_embedding.weight", norm, (hidden,)),
                 ("mtp.pre_fc_norm_hidden.weight", norm, (hidden,))]
    return rows


WIDE = ("hidden_size", "intermediate_size", "moe_intermediate_size", "shared_expert_intermediate_size")


def write_topology(out: str | Path, name: str, seed: int = 0, layers: int | None = None, width: int = 1) -> Path:
    """Write the tokenizer, config and sharded random weights of topology `name` to `out`; `layers` overrides the
    decoder layer count (benchmarks/build_scale.py scales the tensor count with it), `width` multiplies the tiny
    hidden and MLP sizes (`WIDE`; it measures memory against the bytes of a layer)."""
    import torch
    from safetensors.torch import save_file

    if name not in TOPOLOGIES:
        raise ValueError(f"unknown topology {name!r}: {', '.join(TOPOLOGIES)}")
    topology = TOPOLOGIES[name]
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer(out)
    eos_id, pad_id = tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")
    config = tiny_config(topology, len(tokenizer), eos_id, pad_id)
    if layers is not None:
        config["num_hidden_layers"] = layers
    config.update({key: config[key] * width for key in WIDE if key in config})
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory(prefix="topology-template-") as folder:
        template = _template(config, Path(folder))
    rows = tensor_plan(config, template, topology.mtp_layers)
    generator = torch.Generator().manual_seed(seed)
    bounds = [round(i * len(rows) / topology.shards) for i in range(topology.shards + 1)]  # no shard left empty
    weight_map, total = {}, 0
    for shard in range(topology.shards):
        file = f"model-{shard + 1:05d}-of-{topology.shards:05d}.safetensors"
        tensors = {}
        for tensor_name, source, shape in rows[bounds[shard]:bounds[shard + 1]]:
            like = template.get(source)
            if len(shape) == 1 and like is not None:
                tensors[tensor_name] = like.clone()
            else:
                tensors[tensor_name] = (torch.randn(shape, generator=generator) * 0.02).to(torch.bfloat16)
            weight_map[tensor_name] = file
            total += tensors[tensor_name].numel() * 2
        save_file(tensors, out / file, metadata={"format": "pt"})
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": total},
                                                                  "weight_map": weight_map}, indent=2))
    (out / "config.json").write_text(json.dumps(config, indent=2))
    (out / "generation_config.json").write_text(json.dumps({"eos_token_id": [eos_id, pad_id],
                                                            "pad_token_id": pad_id}, indent=2))
    (out / "tiny.json").write_text(json.dumps({"topology": name, "source": topology.source, "seed": seed,
                                               "tensors": len(rows), "made_by": "build.tiny --topology"}))
    return out
