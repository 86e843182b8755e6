"""Full-topology, tiny-width checkpoints: the real model's layer count, expert count, MTP layer, tensor names, shard
count and config keys, with tiny hidden sizes, so every loop of build/ runs over the real number of tensors.

    python -m build.models.tiny --topology qwen3-next-80b|qwen3.5-27b|... --out DIR [--seed 0]

The published configs below are data, copied from each model's `config.json` on the Hugging Face hub
(Qwen/Qwen3-Next-80B-A3B-Instruct, Qwen/Qwen3-30B-A3B, Qwen/Qwen3-32B, as released in 2025), with the shard count of
the release (`model-000NN-of-000SS.safetensors`); only the width keys (`TINY_WIDTHS`) and the vocabulary (the kit's
own 1,024-token tokenizer, build.models.tokenizer) are replaced. Tensor names come from transformers itself: a template
model of the same config with a few layers and two experts is saved by `save_pretrained`, and its per-layer names are
repeated for every layer and expert. Qwen3-Next's MTP weights (`mtp.*`, loaded by vLLM only, see
vllm/model_executor/models/qwen3_next_mtp.py) are a full-attention decoder layer under `mtp.layers.0.` plus `mtp.fc`
(2 x hidden -> hidden) and three norms, written into the last shard as in the release. Approximate where the release
is not reproducible: shards are split by tensor count in order, not at the release's exact boundaries, and the
weights are random (1-D tensors keep transformers' initial values).

Qwen3.5-27B (the study's dense model) is multimodal as published: `Qwen3_5ForConditionalGeneration`, model_type
`qwen3_5`, the text model's keys under `text_config` (its weights under `model.language_model.`), a vision tower
(`vision_config`, weights under `model.visual.`) and one MTP layer (`mtp.`, loaded by vllm/model_executor/models/
qwen3_5_mtp.py), written here as for Qwen3-Next. Approximate: its config below is the published model's figures as
this kit records them elsewhere (README, tests/test_rft.py: 64 layers, three linear-attention layers to one
full-attention layer, hidden 5,120, MLP 17,408, 24 / 4 heads of 256, 16 / 48 linear-attention heads of 128,
vocabulary 248,320) in transformers' Qwen3_5Config layout, with transformers' default vision tower (27 blocks), not
a copy of the release's config.json (not reachable from here), and its shard count (11) is not the release's
verified count.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from build.models.tokenizer import make_tokenizer

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
    Topology("qwen3.5-27b", "Qwen/Qwen3.5-27B figures in transformers' Qwen3_5Config layout (approximate)", 11, {
        "architectures": ["Qwen3_5ForConditionalGeneration"], "model_type": "qwen3_5", "tie_word_embeddings": False,
        "image_token_id": 248056, "video_token_id": 248057, "vision_start_token_id": 248053,
        "vision_end_token_id": 248054, "torch_dtype": "bfloat16",
        "text_config": {
            "model_type": "qwen3_5_text", "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": None,
            "eos_token_id": 248046, "full_attention_interval": 4, "head_dim": 256, "hidden_act": "silu",
            "hidden_size": 5120, "initializer_range": 0.02, "intermediate_size": 17408, "linear_conv_kernel_dim": 4,
            "linear_key_head_dim": 128, "linear_num_key_heads": 16, "linear_num_value_heads": 48,
            "linear_value_head_dim": 128, "max_position_embeddings": 262144, "mtp_num_hidden_layers": 1,
            "num_attention_heads": 24, "num_hidden_layers": 64, "num_key_value_heads": 4, "rms_norm_eps": 1e-06,
            "rope_parameters": {"rope_type": "default", "rope_theta": 10000000, "partial_rotary_factor": 0.25},
            "tie_word_embeddings": False, "use_cache": True, "vocab_size": 248320},
        "vision_config": {
            "model_type": "qwen3_5_vision", "depth": 27, "hidden_act": "gelu_pytorch_tanh", "hidden_size": 1152,
            "in_channels": 3, "initializer_range": 0.02, "intermediate_size": 4304, "num_heads": 16,
            "num_position_embeddings": 2304, "out_hidden_size": 5120, "patch_size": 16, "spatial_merge_size": 2,
            "temporal_patch_size": 2}}, mtp_layers=1),
)}

# Widths small enough that 75k tensors take seconds, large enough for NVFP4's 16-wide blocks and a working forward.
TINY_WIDTHS = {"hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16,
               "shared_expert_intermediate_size": 16, "num_attention_heads": 2, "num_key_value_heads": 1,
               "head_dim": 16, "linear_key_head_dim": 16, "linear_value_head_dim": 16, "linear_num_key_heads": 2,
               "linear_num_value_heads": 4}


# the vision tower's widths (Qwen3.5), its depth kept; its output width is the text model's hidden size
TINY_VISION = {"hidden_size": 16, "intermediate_size": 32, "num_heads": 1, "patch_size": 4,
               "num_position_embeddings": 16}


def text_of(config: dict) -> dict:
    """The text model's keys: `text_config` of a multimodal config (Qwen3.5), else the config itself."""
    return config.get("text_config", config)


def tiny_config(topology: Topology, vocab_size: int, eos_id: int, pad_id: int) -> dict:
    """The published config with tiny widths and the kit tokenizer's vocabulary and ids (in the text config of a
    multimodal one, whose vision tower takes `TINY_VISION`). Pure."""
    config = json.loads(json.dumps(topology.config))  # a deep copy
    text = text_of(config)
    text.update({k: v for k, v in TINY_WIDTHS.items() if k in text})
    text.update(vocab_size=vocab_size, eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None)
    if "vision_config" in config:
        config["vision_config"].update(TINY_VISION, out_hidden_size=text["hidden_size"])
        config.update(eos_token_id=eos_id, pad_token_id=pad_id)
    return config


def _template(config: dict, folder: Path) -> dict:
    """Tensors of a model with the same config but one period of layers and two experts, as transformers saves it
    (by the config's own architecture class: Qwen3.5's multimodal one writes its vision tower and prefixes)."""
    import torch
    import transformers
    from safetensors.torch import load_file
    from transformers import AutoConfig

    small = json.loads(json.dumps(config))
    text = text_of(small)
    text["num_hidden_layers"] = text.get("full_attention_interval", 1)
    if "num_experts" in text:
        text.update(num_experts=2, num_experts_per_tok=1)
    model_type = small.pop("model_type")
    model_class = getattr(transformers, small.pop("architectures")[0])
    model = model_class._from_config(AutoConfig.for_model(model_type, **small), dtype=torch.bfloat16)  # as Auto*
    model.save_pretrained(folder)
    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(load_file(file))
    return tensors


def tensor_plan(config: dict, template: dict, mtp_layers: int) -> list[tuple[str, str, tuple[int, ...]]]:
    """(name, template name, shape) for every tensor of the full topology, in checkpoint order. Pure."""
    import re

    from build.checkpoint import text_prefix

    text = text_of(config)
    period = text.get("full_attention_interval", 1)
    experts = text.get("num_experts", 0)
    base = text_prefix(template)  # `model.` or Qwen3.5's `model.language_model.`
    layer_names: dict[int, list[str]] = {}
    outside = []
    for name in template:
        m = re.match(re.escape(base) + r"layers\.(\d+)\.(.*)$", name)
        if m:
            layer_names.setdefault(int(m.group(1)), []).append(m.group(2))
        else:
            outside.append(name)

    def layer(index: int, prefix: str) -> list[tuple[str, str, tuple[int, ...]]]:
        rows = []
        names = sorted(layer_names[index])
        expert_leaves = [rest.split(".", 3)[3] for rest in names if rest.startswith("mlp.experts.0.")]
        for rest in names:
            source = f"{base}layers.{index}.{rest}"
            shape = tuple(template[source].shape)
            if rest.startswith("mlp.experts."):
                if rest == f"mlp.experts.0.{expert_leaves[0]}":  # expert by expert, as transformers writes them
                    rows += [(f"{prefix}mlp.experts.{e}.{leaf}", f"{base}layers.{index}.mlp.experts.0.{leaf}",
                              tuple(template[f"{base}layers.{index}.mlp.experts.0.{leaf}"].shape))
                             for e in range(experts) for leaf in expert_leaves]
            elif rest == "mlp.gate.weight":
                rows.append((f"{prefix}{rest}", source, (experts, shape[1])))
            else:
                rows.append((f"{prefix}{rest}", source, shape))
        return rows

    embed = f"{base}embed_tokens.weight"
    rows = [(embed, embed, tuple(template[embed].shape))]
    for index in range(text["num_hidden_layers"]):
        rows += layer(index % period, f"{base}layers.{index}.")
    rows += [(n, n, tuple(template[n].shape)) for n in sorted(outside) if n != embed]
    hidden = text["hidden_size"]
    for m in range(mtp_layers):  # the template's last layer has full attention (every `period`-th layer does)
        rows += layer(period - 1, f"mtp.layers.{m}.")
    if mtp_layers:
        norm = f"{base}norm.weight"
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
    text = text_of(config)
    if layers is not None:
        text["num_hidden_layers"] = layers
        if "layer_types" in text:
            text["layer_types"] = text["layer_types"][:layers]
    text.update({key: text[key] * width for key in WIDE if key in text})
    if "vision_config" in config:
        config["vision_config"]["out_hidden_size"] = text["hidden_size"]
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
                                               "tensors": len(rows), "made_by": "build.models.tiny --topology"}))
    return out
