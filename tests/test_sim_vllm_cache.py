"""A hybrid model's KV cache as vLLM itself lays it out and allocates it, against sim.vllm_cache and sim.serving.

vLLM's CPU build (0.32; the same rules as the locked 0.33 wheel's at the places sim/vllm_cache.py names) runs its own
grouping and sizing (`get_kv_cache_configs`, with every pipeline stage's layer specs, the drafter's on the last) and
its own allocator (`KVCacheManager.allocate_slots`) on the moe-4xL4 model's layer specs at their real sizes: no model,
no GPU. The serving model built from sim.vllm_cache must admit the same requests and leave the same blocks free.
Needs the engine environment (make engine-env); skipped in the core-only environment.
"""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest

pytest.importorskip("vllm", reason="vLLM's own cache code needs the engine environment (make engine-env)")

import torch  # noqa: E402

from sim.serving import Job, ServingModel, SharedEngine  # noqa: E402
from sim.vllm_cache import gdn_state_bytes, hybrid_cache  # noqa: E402

MAX_LEN = 114_688  # moe-4xL4's engine.max_model_len
MEMORY = 8_267_812_044  # its engine.kv_cache_memory_bytes (7.7 GiB a GPU)
MAIN = "llla" * 12  # Qwen3-Next: every fourth of 48 layers is full attention, the others Gated DeltaNet


def layouts(tp: int) -> list[str]:
    """One string per pipeline stage, the drafter's (MTP) full-attention layer last: TP2 x PP2 splits the layers 25 /
    23 as the study did; TP4 keeps them on one stage."""
    return [MAIN[:25], MAIN[25:] + "a"] if tp == 2 else [MAIN + "a"]


def vllm_configs(stages: list[str], tp: int, drafts: int, layout: str):
    """vLLM's per-worker KV-cache configs and its scheduler's, from the layers' specs at the model's sizes (FP8
    keys and values of one KV head a GPU, 256 wide; a GDN state as qwen3_next.py shapes it, padded to the page)."""
    from vllm.config import VllmConfig
    from vllm.v1.attention.backends.registry import MambaAttentionBackendEnum
    from vllm.v1.core import kv_cache_utils
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec

    cache = hybrid_cache(stages, MEMORY, 512, gdn_state_bytes(tp, 16, 32, 128, 128, 4, drafts), drafts, MAX_LEN)
    attention = FullAttentionSpec(block_size=cache.block_size, num_kv_heads=1, head_size=256, dtype=torch.float8_e4m3fn)
    channels = (2 * 16 * 128 + 32 * 128) // tp
    state = MambaSpec(block_size=MAX_LEN, shapes=((3 + drafts, channels), (32 // tp, 128, 128)),
                      dtypes=(torch.bfloat16, torch.bfloat16), page_size_padded=attention.page_size_bytes,
                      mamba_type=MambaAttentionBackendEnum.GDN_ATTN, num_speculative_blocks=drafts)
    assert state.page_size_bytes >= sum(math.prod(s) * 2 for s in state.shapes)  # the block holds a state
    specs, index = [], 0
    for stage in stages:
        specs.append({})
        for kind in stage:
            name = f"model.layers.{index}." + ("self_attn.attn" if kind == "a" else "linear_attn")
            specs[-1][name] = attention if kind == "a" else state
            index += 1
    config = VllmConfig()
    config.model_config = SimpleNamespace(max_model_len=MAX_LEN, original_max_model_len=MAX_LEN)
    config.cache_config.kv_cache_layout = layout
    workers = kv_cache_utils.get_kv_cache_configs(config, specs, [MEMORY] * len(stages))
    return cache, config, workers, kv_cache_utils.generate_scheduler_kv_cache_config(workers)


@pytest.mark.parametrize("tp,drafts,layout", [(2, 4, "LBNHC"), (2, 4, "BLNHC"), (2, 0, "LBNHC"), (4, 4, "LBNHC")])
def test_vllm_sizes_a_hybrid_cache_as_sim_derives_it(tp, drafts, layout):
    from vllm.v1.core.kv_cache_utils import get_max_concurrency_for_kv_cache_config
    from vllm.v1.kv_cache_interface import MambaSpec

    cache, config, workers, scheduler = vllm_configs(layouts(tp), tp, drafts, layout)
    assert all(worker.num_blocks == cache.num_blocks for worker in workers)
    states = [g for g in scheduler.kv_cache_groups if isinstance(g.kv_cache_spec, MambaSpec)]
    assert len(scheduler.kv_cache_groups) == 1 + len(states) and len(states) == 3  # 13 attention layers, 36 GDN
    assert cache.state_blocks == sum(1 + g.kv_cache_spec.num_speculative_blocks for g in states)
    # The engine log's "KV cache size: N tokens" (kv_cache_utils.get_kv_cache_capacity: concurrency x max_model_len)
    assert int(get_max_concurrency_for_kv_cache_config(config, scheduler) * MAX_LEN) == cache.logged_tokens


@pytest.mark.parametrize("tokens", [1_000, 20_000, 50_000, 70_000, 100_000])
def test_vllm_admits_as_many_hybrid_requests_as_the_simulator(tokens):
    """64 requests of `tokens` context each offered to vLLM's allocator (the scheduler's call for a request it
    admits: its context and the drafter's look-ahead, the whole sequence gated as scheduler_reserve_full_isl does)
    until one does not fit; the simulator, with the serving model sim.vllm_cache derives, admits as many and leaves
    the same blocks free: attention blocks and 15 state blocks each (1,000 tokens: 64, all of them; 70,000, the
    long-thinking regime: 26, where the cache alone, without the states, would hold 32)."""
    from vllm import SamplingParams
    from vllm.v1.core.kv_cache_manager import KVCacheManager
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
    from vllm.v1.request import Request

    drafts = 4
    cache, config, _, scheduler = vllm_configs(layouts(2), 2, drafts, "LBNHC")
    scheduler_block, hash_block = resolve_kv_cache_block_sizes(scheduler, config)
    manager = KVCacheManager(kv_cache_config=scheduler, max_model_len=MAX_LEN, scheduler_block_size=scheduler_block,
                             hash_block_size=hash_block, enable_caching=False)
    admitted = 0
    while admitted < 64:
        request = Request(str(admitted), list(range(tokens)), SamplingParams(max_tokens=2), None)
        if manager.allocate_slots(request, tokens, num_lookahead_tokens=drafts, full_sequence_must_fit=True) is None:
            break
        admitted += 1
    model = ServingModel(1.0, 0.0, 0.0, 0.0, 0.0, cache.kv_tokens, 64, cache.block_size, draft_tokens=drafts,
                         state_blocks=cache.state_blocks)
    engine = SharedEngine(model)
    for index in range(64):
        engine.submit(Job((index,), tokens, 2), 0.0)
    engine.advance(0.0, math.inf)
    assert engine.timeline[0].running == admitted
    held = -(-(tokens + drafts) // cache.block_size) + cache.state_blocks
    assert manager.block_pool.get_num_free_blocks() == model.blocks - admitted * held
    assert cache.num_blocks - 1 == model.blocks  # the pool less vLLM's null block
    if tokens == 70_000:
        assert admitted == 26 and model.blocks // (held - cache.state_blocks) == 32
