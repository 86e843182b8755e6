"""The simulator's engine against the real one: vLLM's CPU build serves dozens of requests of mixed lengths on a tiny
random-weight Qwen3 with a deliberately small KV cache (preemptions happen), recording every step through a stat
logger as reasoning/engines/vllm.py does; the same requests then replay through sim.serving, with its serving model
calibrated from that run (sim.calibrate on the steps), and the trajectories are compared. Then twice more with chunked
prefill on a 40-token budget (24 requests; contexts of up to five chunks, re-prefills longer): with vLLM's default
admission gate (scheduler_reserve_full_isl: the whole context's blocks free) and without it (the first chunk's), the
regime where preempted requests are re-admitted in chunks and preempted again (measured: 716 and 712 steps, 15 and 98
preemptions, the requests making a token equal on every step in both).

Tolerances (the README quotes them):
- Running requests per step (vLLM's: the requests that produced a token in the step, its generation-token count;
  the scheduler's num_running_reqs is taken after the step's completions left): the simulator's count equals vLLM's
  on at least 90% of the steps, and the mean absolute difference is under 0.25 requests. Both follow the same block
  arithmetic; what differs is timing by a step: the engine-core process may run its first step before every request
  has arrived, which shifts the later preemptions by one step (measured: equal on 93.7% of the steps).
- Preemptions: the simulated total is within 20% (and 3) of vLLM's, and both engines preempt. Totals, not steps:
  vLLM's per-step count reports a preemption when the preempted request next produces output, not when it happens.
- Completion step of each request: the mean absolute difference is under 3% of the run's steps; the completion order
  correlates above 0.95 (Spearman).
- Completion time in seconds, with the step-time model sim.calibrate fits to the run's own steps: the simulated run
  lasts within 15% of the real one, and the mean absolute completion-time error is under 20% of the run's duration.
  Wider than the step tolerance because the CPU's step times on a shared 2-core machine vary with other processes,
  which a model of their mean cannot follow: measured 5-6% (run length) and 3-9% (completions) on a quiet machine,
  14.5% (completions) with a test suite running beside it. On a recorded run, the same model 1.5x too fast or too
  slow gave a run length 30% and 57% off: it fails.
Needs the engine environment (make engine-env); skipped in the core-only environment.
"""

from __future__ import annotations

import math
import random
import time
from dataclasses import replace

import pytest

pytest.importorskip("vllm", reason="the fidelity test needs the engine environment (make engine-env)")

from build.models.tiny import make_checkpoint  # noqa: E402
from sim.calibrate import fit  # noqa: E402
from sim.serving import Job, ServingModel, SharedEngine  # noqa: E402

BLOCK = 32  # vLLM's CPU attention takes multiples of 32
BLOCKS = 36  # usable blocks: 1,152 tokens, about a third of what the first eight requests reach
MAX_SEQS = 8
MAX_LEN = 640
N_REQUESTS = 40


def workload(seed: int = 0) -> list[tuple[list[int], int]]:
    """(prompt token ids, tokens to generate): short and long prompts and outputs, fixed lengths (ignore_eos)."""
    rng = random.Random(seed)
    out = []
    for _ in range(N_REQUESTS):
        prompt = rng.choice([rng.randint(8, 40), rng.randint(60, 200)])
        tokens = rng.choice([rng.randint(10, 60), rng.randint(100, 400)])
        out.append(([rng.randint(20, 250) for _ in range(prompt)], min(tokens, MAX_LEN - prompt)))
    return out


def run_vllm(model_dir, jobs, budget: int = 0, reserve_full_isl: bool = True, blocks: int = BLOCKS,
             max_seqs: int = MAX_SEQS, max_len: int = MAX_LEN):
    """Every request added at once; per step: seconds, running, waiting, KV blocks used, preemptions, prompt tokens;
    and the step at which each request finished. `budget`: chunked prefill on with this max_num_batched_tokens;
    `reserve_full_isl`: vLLM's scheduler_reserve_full_isl (admission on the whole context's blocks, its default);
    `blocks` usable blocks of BLOCK tokens, `max_seqs` sequences at most, `max_len` tokens a request."""
    from vllm import SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.v1.engine.llm_engine import LLMEngine
    from vllm.v1.metrics.loggers import StatLoggerBase

    steps: list[dict] = []

    class StepRecorder(StatLoggerBase):  # vLLM calls record() after every engine step
        def __init__(self, vllm_config, engine_index: int = 0):
            self.cache = vllm_config.cache_config

        def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
            row = {"running": None, "waiting": None, "blocks": None, "preempted": 0, "prompt": 0, "tokens": 0}
            if scheduler_stats is not None:
                row.update(running=scheduler_stats.num_running_reqs, waiting=scheduler_stats.num_waiting_reqs,
                           blocks=round(scheduler_stats.kv_cache_usage * (self.cache.num_gpu_blocks - 1)))
            if iteration_stats is not None:
                row.update(preempted=iteration_stats.num_preempted_reqs, prompt=iteration_stats.num_prompt_tokens,
                           tokens=iteration_stats.num_generation_tokens)
            steps.append(row)

        def log_engine_initialized(self):
            pass

    bytes_per_block = 2 * 2 * 1 * 64 * 2 * BLOCK  # layers x (K, V) x kv heads x head dim x bf16 bytes x block
    args = EngineArgs(model=str(model_dir), dtype="bfloat16", seed=0, max_num_seqs=max_seqs, max_model_len=max_len,
                      block_size=BLOCK, enable_prefix_caching=False, enable_chunked_prefill=budget > 0,
                      max_num_batched_tokens=budget or 4096, kv_cache_memory_bytes=(blocks + 1) * bytes_per_block,
                      scheduler_reserve_full_isl=reserve_full_isl, disable_log_stats=False, enforce_eager=True)
    engine = LLMEngine.from_engine_args(args, stat_loggers=[StepRecorder])
    try:
        cache = engine.vllm_config.cache_config
        for index, (prompt, tokens) in enumerate(jobs):
            engine.add_request(str(index), {"prompt_token_ids": prompt},
                               SamplingParams(max_tokens=tokens, min_tokens=tokens, ignore_eos=True, temperature=0.0))
        seconds, finished = [], {}
        while engine.has_unfinished_requests():
            start = time.perf_counter()
            outputs = engine.step()
            seconds.append(time.perf_counter() - start)
            for out in outputs:
                if out.finished:
                    assert len(out.outputs[0].token_ids) == jobs[int(out.request_id)][1]
                    finished[int(out.request_id)] = len(seconds)
        return steps, seconds, finished, cache.block_size, cache.num_gpu_blocks
    finally:
        engine.engine_core.shutdown()


def replay(model: ServingModel, jobs) -> tuple[dict[int, float], SharedEngine, list[tuple[float, int]]]:
    """The same requests through the simulated engine, all submitted at 0; completion times and the requests making
    a token after each event (with one second a step, its tokens per second)."""
    engine = SharedEngine(model)
    for index, (prompt, tokens) in enumerate(jobs):
        engine.submit(Job((index,), len(prompt), tokens), 0.0)
    finished, now = {}, 0.0
    while True:
        now, done = engine.advance(now, math.inf)
        if now == math.inf:
            return finished, engine, [(s.time, round(s.tokens_per_s)) for s in engine.timeline]
        finished.update({job.key[0]: now for job in done})


def per_step(samples: list[tuple[float, int]], total_steps: int) -> list[int]:
    """Requests making a token in each step 0..total_steps-1 from the simulator's event samples (time = steps)."""
    out, index = [], 0
    for step in range(total_steps):
        while index + 1 < len(samples) and samples[index + 1][0] <= step:
            index += 1
        out.append(samples[index][1])
    return out


def ranks(values: list[float]) -> list[float]:
    order = sorted(range(len(values)), key=values.__getitem__)
    out = [0.0] * len(values)
    for rank, i in enumerate(order):
        out[i] = rank
    return out


def spearman(a: list[float], b: list[float]) -> float:
    ra, rb = ranks(a), ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb))
    return cov / math.sqrt(sum((x - ma) ** 2 for x in ra) * sum((y - mb) ** 2 for y in rb))


@pytest.fixture(scope="module")
def real_run(tmp_path_factory):
    model_dir = make_checkpoint(tmp_path_factory.mktemp("tiny") / "qwen3", "qwen3", seed=0)
    jobs = workload()
    steps, seconds, finished, block, gpu_blocks = run_vllm(model_dir, jobs)
    return jobs, steps, seconds, finished, block, gpu_blocks


@pytest.mark.timeout(900)  # the engine starts in this test's fixture: minutes on a busy CPU
def test_the_cache_model_follows_vllm_step_by_step(real_run):
    jobs, steps, seconds, finished, block, gpu_blocks = real_run
    assert block == BLOCK and len(finished) == N_REQUESTS
    total = len(seconds)
    # One second per step: simulated time counts steps. vLLM's pool keeps one null block: usable = num_gpu_blocks - 1.
    model = ServingModel(1.0, 0.0, 0.0, 0.0, 0.0, (gpu_blocks - 1) * block, MAX_SEQS, block)
    sim_finished, engine, samples = replay(model, jobs)
    real_running = [row["tokens"] for row in steps[:total]]
    sim_running = per_step(samples, total)
    same = sum(a == b for a, b in zip(real_running, sim_running)) / total
    gap = sum(abs(a - b) for a, b in zip(real_running, sim_running)) / total
    real_preempted = sum(row["preempted"] for row in steps)
    print(f"steps {total} (sim {max(sim_finished.values()):.0f}); running equal on {100 * same:.1f}% of steps, "
          f"mean gap {gap:.3f}; preemptions vLLM {real_preempted}, sim {len(engine.preempted)}")
    assert real_preempted > 0 and engine.preempted  # the cache was small enough to matter
    assert same >= 0.90 and gap < 0.25
    assert abs(len(engine.preempted) - real_preempted) <= max(3, 0.2 * real_preempted)
    errors = [abs(sim_finished[i] - finished[i]) for i in range(N_REQUESTS)]
    assert sum(errors) / N_REQUESTS < 0.03 * total, errors
    assert spearman([finished[i] for i in range(N_REQUESTS)], [sim_finished[i] for i in range(N_REQUESTS)]) > 0.95


@pytest.mark.timeout(900)
def test_calibrated_completion_times_follow_vllm(real_run):
    jobs, steps, seconds, finished, block, gpu_blocks = real_run
    # The kit's own calibration on one window per step: tokens, running, context, prompt tokens, seconds.
    windows, clock = [], 0.0
    for row, duration in zip(steps, seconds):
        if row["running"]:
            windows.append({"start": clock, "seconds": duration, "tokens": row["tokens"] or row["running"],
                            "running": row["running"], "prompt_tokens": row["prompt"],
                            "context": row["blocks"] * block})
        clock += duration
    fitted = fit(windows, (gpu_blocks - 1) * block, MAX_SEQS)
    model = replace(fitted.model, startup_s=0.0, block_size=block)
    sim_finished, _, _ = replay(model, jobs)
    real_times = {}
    for i, step in finished.items():
        real_times[i] = sum(seconds[:step])
    duration = sum(seconds)
    error = sum(abs(sim_finished[i] - real_times[i]) for i in range(N_REQUESTS)) / N_REQUESTS
    length = max(sim_finished.values())
    print(f"run {duration:.2f} s, simulated {length:.2f} s; calibrated model a={model.step_a:.4g} b={model.step_b:.4g} "
          f"c={model.step_c:.4g} p={model.prefill_s_per_token:.4g}; completion time error {error:.3f} s "
          f"({100 * error / duration:.1f}%)")
    assert abs(length - duration) < 0.15 * duration
    assert error < 0.20 * duration


CHUNK = 40  # max_num_batched_tokens of the chunked run: 8 decodes leave 32 a step, so most contexts take several
CHUNKED_REQUESTS = 24


@pytest.fixture(scope="module", params=[True, False], ids=["whole-context-gate", "first-chunk"])
def chunked_run(request, tmp_path_factory):
    model_dir = make_checkpoint(tmp_path_factory.mktemp("tiny-chunked") / "qwen3", "qwen3", seed=0)
    jobs = workload(1)[:CHUNKED_REQUESTS]
    steps, seconds, finished, block, gpu_blocks = run_vllm(model_dir, jobs, CHUNK, request.param)
    return jobs, steps, seconds, finished, block, gpu_blocks, request.param


@pytest.mark.timeout(900)
def test_chunked_admission_follows_vllm_step_by_step(chunked_run):
    """Chunked prefill on, a 40-token budget: requests are admitted (on their whole context's free blocks, vLLM's
    default, or on their first chunk's) and prefilled in chunks over later steps beside the decodes, preempted ones
    re-admitted the same way. The same tolerances as without chunks."""
    jobs, steps, seconds, finished, block, gpu_blocks, gate = chunked_run
    assert block == BLOCK and len(finished) == len(jobs)
    total = len(seconds)
    model = ServingModel(1.0, 0.0, 0.0, 0.0, 0.0, (gpu_blocks - 1) * block, MAX_SEQS, block,
                         max_num_batched_tokens=CHUNK, reserve_full_isl=gate)
    sim_finished, engine, samples = replay(model, jobs)
    real_making = [row["tokens"] for row in steps[:total]]
    sim_making = per_step(samples, total)
    same = sum(a == b for a, b in zip(real_making, sim_making)) / total
    gap = sum(abs(a - b) for a, b in zip(real_making, sim_making)) / total
    real_preempted = sum(row["preempted"] for row in steps)
    print(f"chunked ({'whole-context gate' if gate else 'first chunk'}): steps {total} (sim "
          f"{max(sim_finished.values()):.0f}); requests making a token equal on {100 * same:.1f}% of steps, mean gap "
          f"{gap:.3f}; preemptions vLLM {real_preempted}, sim {len(engine.preempted)}")
    assert real_preempted > 0 and engine.preempted  # re-admissions in chunks happened on both
    assert max(len(prompt) for prompt, _ in jobs) > 4 * CHUNK  # contexts of up to 5 chunks, re-prefills longer
    assert same >= 0.90 and gap < 0.25
    assert abs(len(engine.preempted) - real_preempted) <= max(3, 0.2 * real_preempted)
    errors = [abs(sim_finished[i] - finished[i]) for i in range(len(jobs))]
    assert sum(errors) / len(jobs) < 0.03 * total, errors
    assert spearman([finished[i] for i in range(len(jobs))], [sim_finished[i] for i in range(len(jobs))]) > 0.95


# The long-thinking regime (issue 43) scaled down with its ratios: a cache of 18.75 caps (1.8M tokens for 96K caps),
# attempts of 0.45-1.0 cap (~0.73 on average, ~70K of 96K), prompts of a fifteenth to a twenty-fifth of the cap, more
# sequences allowed than the cache holds at the end of an attempt (56 of 64 in flight there).
LONG_CAP = 512
LONG_BLOCKS = 300  # 9,600 tokens: 18.75 caps
LONG_SEQS = 56
LONG_REQUESTS = 60


def long_workload(seed: int = 0) -> list[tuple[list[int], int]]:
    rng = random.Random(seed)
    return [([rng.randint(20, 250) for _ in range(rng.randint(LONG_CAP // 25, LONG_CAP // 15))],
             int(LONG_CAP * rng.uniform(0.45, 1.0))) for _ in range(LONG_REQUESTS)]


@pytest.mark.timeout(900)
def test_long_thinking_running_count_follows_vllm(tmp_path):
    """All requests admitted at first (short contexts), then, as they grow, the cache holds fewer of them and the
    newest are preempted and re-admitted: the simulator's running count follows vLLM's step by step, and its mean
    while requests wait is vLLM's within 3%. Measured (2026-12-07, a busy machine): 986 steps vs 985, running equal
    on 91.0% of the steps (mean gap 0.155), 38.69 vs 38.64 running while requests wait, 48 preemptions on both.
    Equal on >= 85% of the steps, not 90%: each of the 48 preemptions can shift the counts by a step (the first-step
    timing the module doc names), and this run has more of them than the 40-request one; the mean gap keeps < 0.25."""
    model_dir = make_checkpoint(tmp_path / "qwen3", "qwen3", seed=0)
    jobs = long_workload()
    steps, seconds, finished, block, gpu_blocks = run_vllm(model_dir, jobs, blocks=LONG_BLOCKS, max_seqs=LONG_SEQS,
                                                           max_len=LONG_CAP + LONG_CAP // 10)
    assert block == BLOCK and len(finished) == LONG_REQUESTS
    total = len(seconds)
    model = ServingModel(1.0, 0.0, 0.0, 0.0, 0.0, (gpu_blocks - 1) * block, LONG_SEQS, block)
    sim_finished, engine, samples = replay(model, jobs)
    real_running = [row["tokens"] for row in steps[:total]]
    sim_running = per_step(samples, total)
    same = sum(a == b for a, b in zip(real_running, sim_running)) / total
    gap = sum(abs(a - b) for a, b in zip(real_running, sim_running)) / total
    busy = [i for i, row in enumerate(steps[:total]) if row["waiting"]]
    real_busy = sum(real_running[i] for i in busy) / len(busy)
    sim_busy = sum(sim_running[i] for i in busy) / len(busy)
    real_preempted = sum(row["preempted"] for row in steps)
    print(f"long thinking: steps {total} (sim {max(sim_finished.values()):.0f}); running equal on {100 * same:.1f}% "
          f"of steps, mean gap {gap:.3f}; running while requests wait: vLLM {real_busy:.2f}, sim {sim_busy:.2f}; "
          f"preemptions vLLM {real_preempted}, sim {len(engine.preempted)}")
    assert real_preempted > 0 and busy  # the cache bound the running count
    assert same >= 0.85 and gap < 0.25
    assert abs(sim_busy - real_busy) < 0.03 * real_busy
    assert abs(len(engine.preempted) - real_preempted) <= max(3, 0.2 * real_preempted)
