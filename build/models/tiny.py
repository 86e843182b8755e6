"""Tiny random-weight checkpoints of the real architectures, with a tokenizer made here, for tests and demos.

    python -m build.models.tiny --arch qwen3|qwen3_moe|qwen3_next|qwen3_5 --out DIR [--seed 0] [--tied] [--unpatched]
    python -m build.models.tiny --topology qwen3-next-80b|qwen3-30b-a3b|qwen3-32b --out DIR [--seed 0]

No weights can be downloaded in this kit's environments, so every model path is exercised on these: the same config
classes (Qwen3, Qwen3-MoE, Qwen3-Next, Qwen3.5), the same safetensors layout and the real special tokens (<|im_start|>,
<|im_end|>, <think>, </think>, <|endoftext|>), with a Qwen3-style chat template whose generation prompt opens
thinking. The tokenizer is a byte-level BPE trained on a small built-in corpus, digits split one per token as in
Qwen's tokenizer (build.models.tokenizer). By default the output-head rows of <|im_end|> and <|endoftext|> are zeroed
(build.patch_eot's end-of-turn patch, applied in memory), so that (with top-k sampling) thinking is not cut short
by an end of turn. head_dim is 64 because vLLM's CPU attention rejects 16. `--topology` writes a real model's full
set of tensors (layers, experts, MTP, names, shards, config keys) at tiny widths instead (build.models.topology); those
checkpoints are unpatched, as a release is. Qwen3.5 (the dense 27B's architecture) is written as it is published:
`Qwen3_5ForConditionalGeneration`, model_type `qwen3_5` with `text_config` and `vision_config`, the text weights
under `model.language_model.` (three linear-attention layers, then a full-attention one), a vision tower under
`model.visual.` and one MTP layer under `mtp.` (a full-attention decoder layer, `mtp.fc` and three norms: transformers
has no MTP module, vLLM's qwen3_5_mtp.py loads it), in the same file as the rest.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from build.models.tokenizer import make_tokenizer
from build.models.topology import TOPOLOGIES, write_topology

ARCHS = ("qwen3", "qwen3_moe", "qwen3_next", "qwen3_5")
# Qwen3.5's vision tower at tiny widths (one block; its output width is the text model's hidden size)
TINY_VISION = {"depth": 1, "hidden_size": 32, "intermediate_size": 64, "num_heads": 2, "patch_size": 4,
               "num_position_embeddings": 16}


def make_config(arch: str, vocab_size: int, eos_id: int, pad_id: int):
    from transformers import Qwen3_5Config, Qwen3Config, Qwen3MoeConfig, Qwen3NextConfig

    common = dict(vocab_size=vocab_size, hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                  intermediate_size=256, num_hidden_layers=2, max_position_embeddings=32768,
                  tie_word_embeddings=False, eos_token_id=eos_id, pad_token_id=pad_id, bos_token_id=None)
    if arch == "qwen3":
        return Qwen3Config(**common)
    if arch == "qwen3_moe":
        return Qwen3MoeConfig(**common, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                              decoder_sparse_step=1)
    if arch == "qwen3_next":
        return Qwen3NextConfig(**common, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=64,
                               shared_expert_intermediate_size=64, decoder_sparse_step=1,
                               full_attention_interval=2, linear_num_key_heads=2, linear_num_value_heads=2,
                               linear_key_head_dim=32, linear_value_head_dim=32, linear_conv_kernel_dim=4)
    if arch == "qwen3_5":
        text = dict(common, num_hidden_layers=4, full_attention_interval=4, mtp_num_hidden_layers=1,
                    linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32,
                    linear_conv_kernel_dim=4)
        return Qwen3_5Config(text_config=text, vision_config=dict(TINY_VISION, out_hidden_size=common["hidden_size"]),
                             tie_word_embeddings=False, eos_token_id=eos_id, pad_token_id=pad_id)
    raise ValueError(f"unknown architecture {arch!r}: {', '.join(ARCHS)}")


def mtp_tensors(state: dict, text_config, seed: int) -> dict:
    """Qwen3.5's MTP layer as its release stores it (vllm/model_executor/models/qwen3_5_mtp.py loads it): a
    full-attention decoder layer under `mtp.layers.0.` (the model's last full-attention layer's names and shapes,
    fresh random matrices), `mtp.fc` (2 x hidden -> hidden) and three norms."""
    import torch

    full = text_config.layer_types.index("full_attention")
    prefix = f"model.language_model.layers.{full}."
    generator = torch.Generator().manual_seed(seed + 1)
    out = {}
    for name, tensor in state.items():
        if name.startswith(prefix):
            random = (torch.randn(tensor.shape, generator=generator) * 0.02).to(tensor.dtype)
            out["mtp.layers.0." + name[len(prefix):]] = random if tensor.dim() == 2 else tensor.clone()
    hidden = text_config.hidden_size
    out["mtp.fc.weight"] = (torch.randn(hidden, 2 * hidden, generator=generator) * 0.02).to(torch.bfloat16)
    for norm in ("norm", "pre_fc_norm_embedding", "pre_fc_norm_hidden"):
        out[f"mtp.{norm}.weight"] = state["model.language_model.norm.weight"].clone()
    return out


def add_to_last_shard(folder: Path, tensors: dict) -> None:
    """Write `tensors` into the checkpoint's last shard (or its only file) and its index, as releases carry MTP."""
    from safetensors.torch import load_file, save_file

    index_path = folder / "model.safetensors.index.json"
    index = json.loads(index_path.read_text()) if index_path.exists() else None
    file = sorted(set(index["weight_map"].values()))[-1] if index else "model.safetensors"
    save_file({**load_file(folder / file), **tensors}, folder / file, metadata={"format": "pt"})
    if index:
        index["weight_map"].update(dict.fromkeys(tensors, file))
        index_path.write_text(json.dumps(index, indent=2))


def make_checkpoint(out: str | Path, arch: str = "qwen3", seed: int = 0, max_shard_size: str = "50GB",
                    patched: bool = True, tied: bool = False, widths: dict[str, int] | None = None) -> Path:
    """Write a tokenizer and a random-weight model of `arch` to `out` (bf16 safetensors, like a real release;
    a small `max_shard_size` gives several shards, as real checkpoints have). `patched` applies the end-of-turn
    patch in memory and records it as build.patch_eot does; `tied` ties the output head to the embeddings (with
    `patched`, untied again first, as the patch does to a tied checkpoint). `widths` overrides config sizes (W4A16's
    groups of 128 need `moe_intermediate_size=128`: the experts' down_proj inputs)."""
    from build.patch_eot import PATCH_KEY, end_token_ids

    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer = make_tokenizer(out)
    eos_id = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad_id = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    torch.manual_seed(seed)
    config = make_config(arch, len(tokenizer), eos_id, pad_id)
    text_config = config.text_config if arch == "qwen3_5" else config
    for key, value in (widths or {}).items():
        if not hasattr(text_config, key):
            raise ValueError(f"build.models.tiny: {arch} config has no {key!r}")
        setattr(text_config, key, value)
    config.tie_word_embeddings = text_config.tie_word_embeddings = tied
    if arch == "qwen3_5":  # the published class: vision tower and text model (AutoModelForCausalLM: text only)
        from transformers import Qwen3_5ForConditionalGeneration

        model = Qwen3_5ForConditionalGeneration(config).to(torch.bfloat16)
    else:
        model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    if patched:  # what build.patch_eot does to a real checkpoint (SPEC section 2), here in memory
        ids = end_token_ids(tokenizer, {"eos_token_id": [eos_id, pad_id]})
        if tied:  # as the patch does: untie first, so the input embeddings of the end tokens stay as they are
            model.config.tie_word_embeddings = text_config.tie_word_embeddings = False
            model.lm_head.weight = torch.nn.Parameter(model.get_input_embeddings().weight.detach().clone())
        with torch.no_grad():
            model.lm_head.weight[ids] = 0
        setattr(model.config, PATCH_KEY, {"end_of_turn_rows_zeroed": ids, "untied": tied})
    model.generation_config = GenerationConfig(eos_token_id=[eos_id, pad_id], pad_token_id=pad_id)
    model.save_pretrained(out, max_shard_size=max_shard_size)
    if arch == "qwen3_5":
        add_to_last_shard(out, mtp_tensors(model.state_dict(), text_config, seed))
    (out / "tiny.json").write_text(json.dumps({"arch": arch, "seed": seed, "made_by": "build.models.tiny"}))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m build.models.tiny", description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", default="qwen3", choices=ARCHS)
    parser.add_argument("--topology", choices=sorted(TOPOLOGIES),
                        help="a real model's layers, experts, MTP, names, shards and config at tiny widths "
                             "(build.models.topology); replaces --arch")
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-shard-size", default="50GB", help="e.g. 300KB for several shards")
    parser.add_argument("--tied", action="store_true", help="tie the output head to the input embeddings")
    parser.add_argument("--unpatched", action="store_true", help="leave the end-of-turn rows as they are")
    args = parser.parse_args(argv)
    if args.topology:
        print(write_topology(args.out, args.topology, args.seed))
        return
    print(make_checkpoint(args.out, args.arch, args.seed, args.max_shard_size, not args.unpatched, args.tied))


if __name__ == "__main__":
    main()
