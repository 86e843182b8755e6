"""The simulated engine's KV cache: event-solved runs equal a step-by-step replay of vLLM's rules; a cache for N long
requests keeps about N running (not N x cap / length fewer); preemption recomputes the newest request."""

from __future__ import annotations

import math
import random

import pytest

from sim.serving import Job, ServingModel, SharedEngine


def steps_model(kv_tokens: int, max_num_seqs: int, block_size: int = 16, watermark: float = 0.0,
                max_num_batched_tokens: int = 0, draft_tokens: int = 0, reserve_full_isl: bool = True,
                state_blocks: int = 0) -> ServingModel:
    """One second per step, nothing else: simulated time counts engine steps."""
    return ServingModel(1.0, 0.0, 0.0, 0.0, 0.0, kv_tokens, max_num_seqs, block_size, watermark,
                        max_num_batched_tokens, draft_tokens, reserve_full_isl, state_blocks)


def run_events(model: ServingModel, jobs: list[tuple[int, int]]) -> tuple[dict[int, float], SharedEngine]:
    engine = SharedEngine(model)
    for index, (prompt, tokens) in enumerate(jobs):
        engine.submit(Job((index,), prompt, tokens), 0.0)
    finished: dict[int, float] = {}
    now = 0.0
    while True:
        now, done = engine.advance(now, math.inf)
        if now == math.inf:
            return finished, engine
        finished.update({job.key[0]: now for job in done})


def run_steps(model: ServingModel, jobs: list[tuple[int, int]]) -> tuple[dict[int, int], int]:
    """vLLM v1's scheduler rules one step at a time (the reference the event solver must match; read from
    vllm/v1/core/sched/scheduler.py and kv_cache_manager.py): each step has a budget of `max_num_batched_tokens`
    tokens (0: none). Running requests, oldest first, take the blocks of this step's tokens (computed + new + k
    look-ahead slots: a decode's new tokens are its next one and k drafts, a request being prefilled gets its next
    chunk, up to the budget left), preempting the newest when short (itself last); a step that preempted admits
    nothing; else waiting requests are admitted in order while budget is left and the blocks of their first chunk
    (plus k) and, with reserve_full_isl, of their whole context are free above the watermark (none for a request
    admitted when nothing else runs). A running request also holds `state_blocks` blocks from its admission on
    (a hybrid model's linear-attention groups, vLLM's MambaManager). A request makes its first
    token in the step of its last chunk; every later step gives it one (drafts all rejected)."""
    size, blocks, k, state = model.block_size, model.blocks, model.draft_tokens, model.state_blocks
    keep = int(model.watermark * blocks)
    waiting = [{"id": i, "prompt": p, "tokens": t, "generated": 0, "computed": 0, "held": 0, "decoding": False}
               for i, (p, t) in enumerate(jobs)]
    running: list[dict] = []
    finished, step, preemptions = {}, 0, 0

    def blocks_for(tokens: int) -> int:
        return -(-tokens // size)

    def held() -> int:
        return sum(j["held"] + state for j in running)

    while waiting or running:
        budget = model.max_num_batched_tokens or math.inf
        preempted, scheduled, index = False, [], 0
        while index < len(running) and budget > 0:
            job = running[index]
            context = job["prompt"] + job["generated"]
            new = 1 + k if job["decoding"] else min(context - job["computed"], budget)
            target = blocks_for(job["computed"] + new + k)
            while held() - job["held"] + target > blocks:
                victim = running.pop()
                victim.update(computed=0, held=0, decoding=False)
                waiting.insert(0, victim)
                preempted, preemptions = True, preemptions + 1
                if victim is job:
                    break
            if job not in running:
                break
            job["held"] = max(job["held"], target)
            budget -= new
            scheduled.append((job, new))
            index += 1
        if not preempted:
            while waiting and budget > 0 and len(running) < model.max_num_seqs:
                job = waiting[0]
                new = min(job["prompt"] + job["generated"], budget)
                target = blocks_for(new + k)
                whole = blocks_for(job["prompt"] + job["generated"]) if model.reserve_full_isl else 0
                if held() + max(target, whole) + state > blocks - (keep if running else 0):
                    break
                running.append(waiting.pop(0))
                job["held"] = target
                budget -= new
                scheduled.append((job, new))
        step += 1
        for job, new in scheduled:
            if job["decoding"]:
                job["computed"] += 1
                job["generated"] += 1
            else:
                job["computed"] += new
                if job["computed"] == job["prompt"] + job["generated"]:
                    job["generated"] += 1
                    job["decoding"] = True
        for job in [j for j in running if j["generated"] >= j["tokens"]]:
            running.remove(job)
            finished[job["id"]] = step
    return finished, preemptions


@pytest.mark.parametrize("seed", range(12))
def test_event_solver_equals_the_step_by_step_rules(seed):
    rng = random.Random(seed)
    size = rng.choice([1, 4, 16])
    jobs = [(rng.randint(1, 120), rng.randint(1, 300)) for _ in range(rng.randint(5, 40))]
    largest = max(p + t for p, t in jobs)
    model = steps_model(rng.randint(largest, 4 * largest) // size * size + size, rng.randint(2, 16), size,
                        rng.choice([0.0, 0.0, 0.05]))
    events, engine = run_events(model, jobs)
    steps, preemptions = run_steps(model, jobs)
    assert events == {i: float(s) for i, s in steps.items()}
    assert len(engine.preempted) == preemptions
    assert engine.tokens == sum(t for _, t in jobs)


@pytest.mark.parametrize("seed", range(16))
def test_chunked_prefill_and_drafts_follow_the_step_by_step_rules(seed):
    """A token budget smaller than many contexts (requests admitted on their first chunk, prefilled over later steps
    while the decodes go on, re-admitted in chunks after preemption) and draft look-ahead, against the reference."""
    rng = random.Random(100 + seed)
    size = rng.choice([1, 4, 16])
    seqs, drafts = rng.randint(2, 12), rng.choice([0, 0, 1, 4])
    jobs = [(rng.randint(1, 200), rng.randint(1, 300)) for _ in range(rng.randint(5, 40))]
    largest = max(p + t for p, t in jobs) + 2 * drafts
    budget = rng.choice([seqs * (1 + drafts) + 1, seqs * (1 + drafts) + rng.randint(2, 64), 0])
    model = steps_model(rng.randint(largest, 3 * largest) // size * size + size, seqs, size,
                        rng.choice([0.0, 0.0, 0.05]), budget, drafts, rng.choice([True, False]))
    events, engine = run_events(model, jobs)
    steps, preemptions = run_steps(model, jobs)
    assert events == {i: float(s) for i, s in steps.items()}
    assert len(engine.preempted) == preemptions
    assert engine.tokens == sum(t for _, t in jobs)


@pytest.mark.parametrize("seed", range(16))
def test_state_blocks_follow_the_step_by_step_rules(seed):
    """A hybrid model's per-request state blocks (held from admission, freed at the end or on preemption) beside
    chunked prefill and drafts, against the reference."""
    rng = random.Random(300 + seed)
    size = rng.choice([1, 4, 16])
    seqs, drafts, state = rng.randint(2, 12), rng.choice([0, 1, 4]), rng.randint(1, 15)
    jobs = [(rng.randint(1, 200), rng.randint(1, 300)) for _ in range(rng.randint(5, 40))]
    largest = max(p + t for p, t in jobs) + 2 * drafts + state * size
    budget = rng.choice([seqs * (1 + drafts) + rng.randint(2, 64), 0])
    model = steps_model(rng.randint(largest, 3 * largest) // size * size + size, seqs, size,
                        rng.choice([0.0, 0.05]), budget, drafts, rng.choice([True, False]), state)
    events, engine = run_events(model, jobs)
    steps, preemptions = run_steps(model, jobs)
    assert events == {i: float(s) for i, s in steps.items()}
    assert len(engine.preempted) == preemptions
    assert engine.tokens == sum(t for _, t in jobs)
    assert max(s.blocks_used for s in engine.timeline) <= model.blocks


def test_state_blocks_leave_fewer_running():
    """Four requests that fit 20 blocks of 4 tokens together as attention alone (4 x 4 blocks at their end). With 3
    state blocks each, the four are admitted (2 + 3 blocks each: the 20), then, growing, the newest are preempted
    one after the other."""
    jobs = [(4, 12)] * 4
    assert run_events(steps_model(80, 8, 4), jobs)[1].preempted == []
    _, engine = run_events(steps_model(80, 8, 4, state_blocks=3), jobs)
    assert [key for _, key, _ in engine.preempted] == [(3,), (2,)]
    with pytest.raises(ValueError, match=r"\(0,\) needs 16 KV tokens and 17 state blocks.*holds 80 \(20 blocks"):
        SharedEngine(steps_model(80, 8, 4, state_blocks=17)).submit(Job((0,), 4, 12), 0.0)


def test_drafts_hold_blocks_for_their_look_ahead():
    """Two requests that fit a 4-block cache together without drafts; with 4 drafts each holds 8 more tokens (4
    computed drafts, 4 slots for the drafter), so the second is preempted."""
    jobs = [(16, 12), (16, 12)]
    assert run_events(steps_model(64, 4, 16), jobs)[1].preempted == []
    _, engine = run_events(steps_model(64, 4, 16, draft_tokens=4), jobs)
    assert [key for _, key, _ in engine.preempted] == [(1,)]


def test_a_long_context_is_admitted_on_its_first_chunk():
    """A 100-token prompt with a 24-token budget beside a short request: admitted on a first chunk of 20 tokens (the
    short prompt took 4), it is prefilled over five steps (23 tokens a step beside the other's decode), makes its
    first token in the fifth step and its second in the sixth."""
    model = steps_model(128, 4, 4, max_num_batched_tokens=24)
    engine = SharedEngine(model)
    engine.submit(Job((0,), 4, 50), 0.0)
    engine.submit(Job((1,), 100, 2), 0.0)
    now, done = engine.advance(0.0, math.inf)
    assert engine.prefilled >= 4 + 100 and [j.key for j in done] == [(1,)]
    assert now == 1 + 5  # step 1: request 0's prompt and request 1's first 20 tokens; 23 a step after; 2 tokens


def test_admission_waits_for_the_whole_context_unless_told_otherwise():
    """vLLM's default (scheduler_reserve_full_isl) admits a request only when its whole context's blocks are free;
    off, its first chunk's suffice. 16 blocks of 4 tokens, a 36-token request running: a 40-token prompt waits for
    it by default, and is admitted at once on its first chunk without the gate."""
    for gate, started in ((True, math.nan), (False, 1.0)):  # step 2 (from 1 s): the first prefill's last 12 tokens
        engine = SharedEngine(steps_model(64, 4, 4, max_num_batched_tokens=20, reserve_full_isl=gate))
        first, second = Job((0,), 32, 4), Job((1,), 40, 4)
        engine.submit(first, 0.0)
        engine.submit(second, 0.0)
        now, done = engine.advance(0.0, math.inf)
        assert done == [first] and now == 5.0  # 2 prefill steps (the second makes a token), 3 more tokens
        assert math.isnan(second.started) if gate else second.started == started


def test_the_budget_must_leave_room_for_prefill():
    with pytest.raises(ValueError, match="max_num_batched_tokens 8 leaves no room"):
        steps_model(64, 4, max_num_batched_tokens=8, draft_tokens=1)


def test_a_cache_for_n_long_requests_keeps_about_n_running():
    """The issue's regime: caps of 96K, requests that think ~30K, a cache for N = 20 of them. Reserving the cap would
    run N x 35K / 103K ~ 7; vLLM (and the simulator) runs at least N, admitting on the blocks in use."""
    rng = random.Random(0)
    n, prompt, cap = 20, 5_000, 96_000
    lengths = [int(min(rng.lognormvariate(math.log(30_000), 0.5), cap)) for _ in range(200)]
    kv = n * (prompt + 30_000)
    model = ServingModel(0.03, 0.0008, 3e-8, 0.0, 0.0, kv, 256, 16)
    engine = SharedEngine(model)
    for index, tokens in enumerate(lengths):
        engine.submit(Job((index,), prompt, tokens), 0.0)
    now = 0.0
    while now != math.inf:
        now, _ = engine.advance(now, math.inf)
    busy = [(a, b) for a, b in zip(engine.timeline, engine.timeline[1:]) if a.waiting > 0]
    mean_running = sum(a.running * (b.time - a.time) for a, b in busy) / sum(b.time - a.time for a, b in busy)
    reserved = kv // (prompt + cap + 4_000)
    assert reserved <= 7
    assert n <= mean_running <= 1.5 * n, mean_running
    assert max(s.blocks_used for s in engine.timeline) <= model.blocks
    assert engine.tokens == sum(lengths)


def test_preemption_recomputes_the_newest_request_from_the_front_of_the_queue():
    # 10 blocks of 4 tokens; three requests of prompt 4: admitted together, they outgrow the cache.
    model = steps_model(40, 8, 4)
    engine = SharedEngine(model)
    for index in range(3):
        engine.submit(Job((index,), 4, 20), 0.0)
    now, done = engine.advance(0.0, math.inf)
    assert [key for _, key, _ in engine.preempted] == [(2,), (1,)]  # the newest first, then the next newest
    # Back at the front of the queue in their admission order, keeping what they generated.
    assert [(j.key, j.generated) for j in engine.waiting] == [(key, g) for _, key, g in reversed(engine.preempted)]
    assert all(g > 0 for _, _, g in engine.preempted)
    while now != math.inf:
        now, more = engine.advance(now, math.inf)
        done += more
    assert sorted(j.key[0] for j in done) == [0, 1, 2] and engine.tokens == 60
    # Every preemption re-prefills the prompt and the tokens the request had generated.
    assert engine.prefilled == 3 * 4 + sum(4 + generated for _, _, generated in engine.preempted)


def test_a_request_larger_than_the_cache_is_refused_by_name():
    engine = SharedEngine(steps_model(64, 4))
    with pytest.raises(ValueError, match=r"\('t', 0, 1\).*holds 64"):
        engine.submit(Job(("t", 0, 1), 40, 40), 0.0)


def test_the_log_line_gives_back_the_pool():
    """vLLM logs "KV cache size: N tokens" as the requests at max_model_len that fit, each with its state blocks
    (sim.vllm_cache); pool_from_log inverts it. The study's moe run logged 1,957,095 tokens (seed ~4479): at its
    1,136-token blocks and 15 state blocks a request, a pool of 1,980 blocks, not 1,957,095 / 1,136 = 1,722."""
    from sim.vllm_cache import gdn_state_bytes, hybrid_cache, pool_from_log

    main = "llla" * 12
    for stages, tp in (([main[:25], main[25:] + "a"], 2), ([main + "a"], 4)):
        for drafts in (0, 3, 4):
            cache = hybrid_cache(stages, 8_267_812_044, 512, gdn_state_bytes(tp, 16, 32, 128, 128, 4, drafts), drafts,
                                 114_688)
            assert pool_from_log(cache.logged_tokens, 114_688, cache.block_size, cache.state_blocks) == cache.num_blocks
    assert pool_from_log(1_957_095, 114_688, 1_136, 15) == 1_980
    with pytest.raises(ValueError, match="strings of 'a' and 'l'"):
        hybrid_cache(["llla", "lx"], 1 << 30, 512, 4096, 0, 1024)


@pytest.mark.parametrize("name", ["moe-4xL4", "moe-4xL4-direct"])
def test_the_moe_serving_models_hold_vllms_cache_for_their_profiles_layout(name):
    """The shipped serving model's cache is what sim.vllm_cache derives from its profile's layout (the pipeline
    stages of pp_layer_partition, the drafter's attention layer on the last, the tensor-parallel split of the 2 KV and
    32 value heads, the drafts, the cache memory): a profile or a serving file changed alone fails here. Before issue
    43 the files held 2.47M tokens in blocks of 1,072 and no state blocks."""
    from sim.serving import load_serving
    from sim.scenario import SERVING_MODELS
    from sim.vllm_cache import gdn_state_bytes, hybrid_cache
    from submission.profiles import load

    engine = load(name).engine
    layers = "llla" * 12  # Qwen3-Next's 48 layers: every fourth full attention
    cuts = [int(n) for n in engine.pp_layer_partition.split(",")]
    assert sum(cuts) == len(layers) and len(cuts) == engine.pipeline_parallel_size
    stages = [layers[sum(cuts[:i]):sum(cuts[:i + 1])] for i in range(len(cuts))]
    stages[-1] += "a" if engine.mtp_speculative_tokens else ""
    tp, drafts = engine.tensor_parallel_size, engine.mtp_speculative_tokens
    kv_heads = max(1, 2 // tp)  # 2 KV heads, replicated past TP2; FP8 keys and values 256 wide
    cache = hybrid_cache(stages, engine.kv_cache_memory_bytes, kv_heads * 2 * 256,
                         gdn_state_bytes(tp, 16, 32, 128, 128, 4, drafts), drafts, engine.max_model_len)
    serving = load_serving(SERVING_MODELS / f"{name}.toml")
    assert (serving.kv_tokens, serving.block_size, serving.state_blocks) == (
        cache.kv_tokens, cache.block_size, cache.state_blocks) == (2_304_944, 1_136, 15)
