"""vLLM's scheduler, less the grammar bitmask of requests that are still thinking: the class the `vllm` engine runs.

Why: vLLM (0.32 and 0.33, vllm/v1/core/sched/scheduler.py `get_grammar_bitmask`) gives every structured-output
request a bitmask row at every step, and the runner applies the mask to the logits, even while the request reasons
and every row of it is the all-permissive mask. Every kit request carries the answer grammar and reasons through
nearly all of its steps, so that is per-request Python work in the scheduler (StructuredOutputManager.grammar_bitmask
fills a row per request and draft), a `[rows x vocab/32]` int32 mask sent to the worker, and a pass over the logits
(on CPU a bf16 -> float32 copy around xgrammar's kernel, vllm/v1/structured_output/utils.py), for nothing: 0.34 ms of a
3 ms step on the CPU engine (11%), 0.13 ms with this class (benchmarks/RESULTS.md, issue 31).

What changes: a request is left out of the batch's grammar output exactly when vLLM would give it only permissive
rows: its constraint starts after its last scheduled draft (`StructuredOutputManager._get_constraint_bounds`, the
rule vLLM's own fill uses), no draft is a -1 placeholder (so 0.33's `num_acceptable_drafts` invalidates nothing for it
either way, vllm/v1/worker/gpu/structured_outputs.py `grammar_invalid_drafts`), and no implicit reasoning end is
masked while it reasons (0.33's `_masked_reasoning_ends`; 0.32 has none). A batch left with no request gets None, as
one without structured output does. The grammar still advances in `update_from_output` (`accept_tokens`), which is
untouched, so the first step after `</think>` is constrained as before.

Not changed (vLLM's, said in benchmarks/RESULTS.md): with asynchronous scheduling (0.33 on the GPU) the engine core
still defers each step's sampling while a structured-output request has tokens in flight
(vllm/v1/engine/core.py `step_with_batch_queue`, `pending_structured_output_tokens`), because whether a thinking
request is constrained at the next step depends on the token it is sampling now.

The engine picks the class after vLLM has settled `scheduler_config.async_scheduling`
(`SCHEDULERS` in submission.engines.vllm), as vLLM's own `get_scheduler_cls` would pick between its two.
"""

from __future__ import annotations

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.output import GrammarOutput
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.structured_output.utils import strip_speculative_padding


def needs_grammar(manager, request, drafts: list[int]) -> bool:
    """Whether vLLM's fill would give `request` any row other than the all-permissive mask this step."""
    kept = strip_speculative_padding(drafts)
    if len(kept) != len(drafts):
        return True  # placeholders: leave the rows and their invalidation to vLLM
    if manager._get_constraint_bounds(request, kept).constraint_start <= len(kept):
        return True
    masked_reasoning_ends = getattr(manager, "_masked_reasoning_ends", None)  # vLLM 0.33
    return bool(masked_reasoning_ends and masked_reasoning_ends(request))


class _GrammarAfterThinking:
    """`get_grammar_bitmask` over the requests that need a grammar row this step (vLLM's body otherwise)."""

    def get_grammar_bitmask(self, scheduler_output) -> GrammarOutput | None:
        if not scheduler_output.has_structured_output_requests:
            return None
        manager = self.structured_output_manager
        drafts = scheduler_output.scheduled_spec_decode_tokens
        ids = [req_id for req_id in scheduler_output.num_scheduled_tokens
               if (request := self.requests.get(req_id)) and request.use_structured_output
               and not request.is_prefill_chunk and needs_grammar(manager, request, drafts.get(req_id, []))]
        if not ids:
            return None
        bitmask = manager.grammar_bitmask(self.requests, ids, drafts)
        acceptable = [len(strip_speculative_padding(drafts.get(req_id, []))) for req_id in ids]
        return GrammarOutput(ids, bitmask, acceptable)


class GrammarAfterThinkingScheduler(_GrammarAfterThinking, Scheduler):
    """vLLM's synchronous scheduler (async_scheduling off: the CPU build, pipeline-parallel layouts)."""


class GrammarAfterThinkingAsyncScheduler(_GrammarAfterThinking, AsyncScheduler):
    """vLLM's asynchronous scheduler (async_scheduling on: 0.33's default on the GPU)."""
