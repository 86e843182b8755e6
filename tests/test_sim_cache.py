"""The simulated engine's KV cache: event-solved runs equal a step-by-step replay of vLLM's rules; a cache for N long
requests keeps about N running (not N x cap / length fewer); preemption recomputes the newest request."""

from __future__ import annotations

import math
import random

import pytest

from sim.serving import Job, ServingModel, SharedEngine


def steps_model(kv_tokens: int, max_num_seqs: int, block_size: int = 16, watermark: float = 0.0) -> ServingModel:
    """One second per step, nothing else: simulated time counts engine steps."""
    return ServingModel(1.0, 0.0, 0.0, 0.0, 0.0, kv_tokens, max_num_seqs, block_size, watermark)


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
    """vLLM v1's scheduler rules one step at a time (the reference the event solver must match): running requests
    take the blocks of their next token oldest first, preempting the newest when short; a step that preempted admits
    nothing; else waiting requests are admitted in order while their blocks fit above the watermark (none for a
    request admitted when nothing else runs)."""
    size, blocks = model.block_size, model.blocks
    keep = int(model.watermark * blocks)
    waiting = [[i, p, t, 0] for i, (p, t) in enumerate(jobs)]  # id, prompt, tokens, generated
    running: list[list[int]] = []
    finished, step, preemptions = {}, 0, 0

    def need(job):
        return -(-(job[1] + job[3]) // size)

    while waiting or running:
        preempted = False
        while sum(need(j) for j in running) > blocks:
            waiting.insert(0, running.pop())
            preempted, preemptions = True, preemptions + 1
        if not preempted:
            while (waiting and len(running) < model.max_num_seqs
                   and sum(need(j) for j in running) + need(waiting[0]) <= blocks - (keep if running else 0)):
                running.append(waiting.pop(0))
        step += 1
        for job in running:
            job[3] += 1
        for job in [j for j in running if j[3] >= j[2]]:
            running.remove(job)
            finished[job[0]] = step
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
