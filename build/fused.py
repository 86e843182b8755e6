"""Which checkpoint weights vLLM fuses into one linear layer, per architecture: the quantiser gives each such set one
global scale (and one static input scale), because vLLM keeps only one per fused linear (for NVFP4 it takes the first
member's and warns "Accuracy may be degraded" when they differ).

One table per architecture (`model_type` in config.json), written from vLLM 0.33's model classes:
`packed_modules_mapping` of `Qwen3ForCausalLM` (qwen3.py), `Qwen3MoeForCausalLM` (qwen3_moe.py; it adds gate_up_proj
only when the config has `mlp_only_layers`, i.e. dense MLP layers exist), `Qwen3NextForCausalLM` (qwen3_next.py) and
`Qwen3NextMTP` (qwen3_next_mtp.py), plus the routed experts' fused `w13` (gate_proj then up_proj of one expert,
`FusedMoE.make_expert_params_mapping`). Shared experts are an MLP with its own gate_up_proj in vLLM (the
`.shared_expert.gate_proj` entries of Qwen3-Next's `hf_to_vllm_mapper`), so the generic gate/up entry covers them.
tests/test_fused_groups.py checks the tables against the locked wheel's source. Single-member entries (Qwen3-Next's
`in_proj_qkvz`, `in_proj_ba`: already one tensor each in the checkpoint) need no shared scale and are left out.
"""

from __future__ import annotations

QKV = ("q_proj", "k_proj", "v_proj")
GATE_UP = ("gate_proj", "up_proj")

# architecture -> fused name -> the checkpoint leaf names it is made of (in vLLM's shard order)
PACKED: dict[str, dict[str, tuple[str, ...]]] = {
    "qwen3": {"qkv_proj": QKV, "gate_up_proj": GATE_UP},
    "qwen3_moe": {"qkv_proj": QKV, "gate_up_proj": GATE_UP},  # gate_up: dense layers (mlp_only_layers) and experts' w13
    "qwen3_next": {"qkv_proj": QKV, "gate_up_proj": GATE_UP},  # also the MTP layer (Qwen3NextMTP: the same two)
}


def table_for(config: dict) -> dict[str, tuple[str, ...]]:
    """The fused-group table of a checkpoint's config.json (its `model_type`, or the text model's)."""
    model_type = config.get("model_type") or config.get("text_config", {}).get("model_type")
    if model_type not in PACKED:
        raise ValueError(f"config.json: model_type {model_type!r} has no fused-group table (known: {sorted(PACKED)})")
    return PACKED[model_type]


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
