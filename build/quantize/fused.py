"""Which checkpoint weights vLLM fuses into one linear layer, per architecture: the quantiser gives each such set one
global scale (and one static input scale), because vLLM keeps only one per fused linear (for NVFP4 it takes the first
member's and warns "Accuracy may be degraded" when they differ).

One table per architecture (`model_type` in config.json), written from vLLM 0.33's model classes:
`packed_modules_mapping` of `Qwen3ForCausalLM` (qwen3.py), `Qwen3MoeForCausalLM` (qwen3_moe.py; it adds gate_up_proj
only when the config has `mlp_only_layers`, i.e. dense MLP layers exist), `Qwen3NextForCausalLM` (qwen3_next.py),
`Qwen3NextMTP` (qwen3_next_mtp.py), `Qwen3_5ForCausalLMBase` and `Qwen3_5ForConditionalGeneration` (qwen3_5.py: the
linear-attention layers' `in_proj_qkv` + `in_proj_z` load into `in_proj_qkvz`, `in_proj_b` + `in_proj_a` into
`in_proj_ba`, `Qwen3_5Model.hf_to_vllm_mapper`) and `Qwen3_5MTP` (qwen3_5_mtp.py), plus the routed experts' fused `w13`
(gate_proj then up_proj of one expert,
`FusedMoE.make_expert_params_mapping`). Shared experts are an MLP with its own gate_up_proj in vLLM (the
`.shared_expert.gate_proj` entries of Qwen3-Next's `hf_to_vllm_mapper`), so the generic gate/up entry covers them.
tests/test_fused_groups.py checks the tables against the locked wheel's source. Single-member entries (Qwen3-Next's
`in_proj_qkvz`, `in_proj_ba`: already one tensor each in the checkpoint) need no shared scale and are left out. The
tables match leaf names, so Qwen3.5's prefixes (`model.language_model.layers.N.`, the MTP layer's `mtp.layers.0.`,
which vLLM renames: `Qwen3_5ForConditionalGeneration.hf_to_vllm_mapper`, `Qwen3_5MTP.load_weights`) need no entry.

`UNQUANTISED_MTP_HEAD` names the architectures whose vLLM MTP drafter builds its own output head without the
quantization config, with the line that decides it: a quantised `lm_head` beside MTP weights cannot load there.
Qwen3.5's `Qwen3_5MTP` builds its head with it (qwen3_5_mtp.py:238-243, `quant_config=self.quant_config`), so Qwen3.5
is not listed. Its `mtp.fc` is built with the checkpoint's quantization config except under ModelOpt NVFP4
(qwen3_5_mtp.py:89-106): under compressed-tensors it follows the config's targets like any linear, so an `mtp.fc`
the recipe leaves unmatched loads as BF16.
"""

from __future__ import annotations

QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")

# architecture -> fused name -> the checkpoint leaf names it is made of (in vLLM's shard order)
PACKED: dict[str, dict[str, tuple[str, ...]]] = {
    "qwen3": {"qkv_proj": QKV, "gate_up_proj": GATE_UP},
    "qwen3_moe": {"qkv_proj": QKV, "gate_up_proj": GATE_UP},  # gate_up: dense layers (mlp_only_layers) and experts' w13
    "qwen3_next": {"qkv_proj": QKV, "gate_up_proj": GATE_UP},  # also the MTP layer (Qwen3NextMTP: the same two)
    # the MTP layer is full attention (Qwen3_5MTP: qkv_proj and gate_up_proj only)
    "qwen3_5": {"qkv_proj": QKV, "gate_up_proj": GATE_UP, "in_proj_qkvz": ("in_proj_qkv", "in_proj_z"),
                "in_proj_ba": ("in_proj_b", "in_proj_a")},
}

# architecture -> where vLLM 0.33's MTP drafter builds its output head without the quantization config
UNQUANTISED_MTP_HEAD: dict[str, str] = {
    "qwen3_next": "qwen3_next_mtp.py:198-202 (Qwen3NextMTP's ParallelLMHead has no quant_config)",
}

# architecture -> the output head's names in vLLM 0.33's models of it, each a target of a quantised head in the
# quantization config: the multimodal Qwen3.5 class builds its text model under `language_model` (qwen3_5.py:522-525),
# so its head is `language_model.lm_head` (qwen3_5.py:347-352), and the config's mapper leaves a target without a dot
# as it is (compressed_tensors.py:142-146: `lm_head` is not renamed), while its MTP drafter's head is `lm_head`
# (qwen3_5_mtp.py:238-243). Every other architecture here: `lm_head` alone.
HEAD_TARGETS: dict[str, tuple[str, ...]] = {"qwen3_5": ("lm_head", "language_model.lm_head")}


def model_type(config: dict) -> str | None:
    """A config.json's architecture: its `model_type`, or its text model's."""
    return config.get("model_type") or config.get("text_config", {}).get("model_type")


def table_for(config: dict) -> dict[str, tuple[str, ...]]:
    """The fused-group table of a checkpoint's config.json (its `model_type`, or the text model's)."""
    arch = model_type(config)
    if arch not in PACKED:
        raise ValueError(f"config.json: model_type {arch!r} has no fused-group table (known: {sorted(PACKED)})")
    return PACKED[arch]


def fused_name(module: str, table: dict[str, tuple[str, ...]]) -> str | None:
    """`model.layers.3.self_attn.k_proj` -> `model.layers.3.self_attn.qkv_proj` (the fused linear it loads into),
    `...mlp.experts.7.up_proj` -> `...mlp.experts.7.gate_up_proj`; None for a module vLLM does not fuse. Pure, O(1)."""
    parent, _, leaf = module.rpartition(".")
    for fused, members in table.items():
        if leaf in members and len(members) > 1:
            return f"{parent}.{fused}"
    return None


def groups(modules: list[str] | set[str], table: dict[str, tuple[str, ...]]) -> dict[str, list[str]]:
    """Fused name -> its members present in `modules`, in the table's order (one pass: linear in the module count)."""
    order = {leaf: i for members in table.values() for i, leaf in enumerate(members)}
    out: dict[str, list[str]] = {}
    for module in modules:
        if (name := fused_name(module, table)) is not None:
            out.setdefault(name, []).append(module)
    return {name: sorted(members, key=lambda m: order[m.rpartition(".")[2]]) for name, members in out.items()}
