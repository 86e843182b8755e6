"""vLLM's asynchronous scheduler, keeping each request's last MTP drafts so that a deferred step under pipeline
parallelism validates its own requests' drafts: the class the `vllm` engine runs when vLLM schedules asynchronously.

Why (issue 43; vLLM 0.33.0, reproduced on CPU with 0.33's own classes by tests/test_pp_drafts.py): with async
scheduling every step of a structured-output request that has tokens in flight is deferred
(v1/core/sched/async_scheduler.py `_update_after_schedule`: `pending_structured_output_tokens`), and the deferred step
fills its drafts' -1 placeholders from the worker's one draft slot (v1/engine/core.py `step_with_batch_queue` ~805-813,
`take_draft_token_ids`; v1/worker/gpu/spec_decode/utils.py `DraftTokensHandler`), which holds the drafts of the batch
sampled last. Under pipeline parallelism 0.33 staggers each request's decodes by pp steps
(`next_decode_eligible_step`), so the batch sampled last is the other half of the requests:
`update_draft_token_ids_in_output` finds none of the deferred step's requests, their drafts stay placeholders, the
grammar output says 0 acceptable drafts for each, and the worker invalidates every draft of every grammar request
(v1/worker/gpu/structured_outputs.py `grammar_invalid_drafts`). Every kit request has a grammar: the study's TP2 x PP2
layout paid for 4 drafts a step and accepted none (pp 1: all of them).

What changes: the drafts each slot read brings for requests outside the deferred step (the half sampled last) are
kept, each with how many times its request had been scheduled then; at that request's own next deferred step, if the
slot does not hold it and it has been scheduled exactly once since (this step: no other step of it was sampled in
between), its kept drafts are passed on, and vLLM's own `update_draft_token_ids_in_output` validates them against the
grammar as it would have. They are the drafts the worker verifies at that step: it keeps each request's drafts
(`req_states.draft_tokens`, model_runner.py `sample_tokens` ~2326) from its last sampled step to its next, and when
the slot is read every step scheduled before the deferred one has been sampled (the engine core samples a step at once
or, deferred, right after this call). Nothing else differs from vLLM's `AsyncScheduler`; with pp 1 the slot always
holds the deferred step's own requests and nothing kept is used. The synchronous scheduler (async off: the CPU build)
never defers and is vLLM's own.

A vLLM whose schedulers no longer define a method this class overrides (its abstract interface still may) would not
call it as this class expects: the constructor, at engine start, refuses then.
"""

from __future__ import annotations

from vllm.v1.core.sched.async_scheduler import AsyncScheduler
from vllm.v1.core.sched.scheduler import Scheduler
from vllm.v1.outputs import DraftTokenIds

# The engine core's calls this class overrides (v1/engine/core.py ~735 and ~812).
HOOKS = ("schedule", "update_draft_token_ids_in_output")


class KeptDraftsAsyncScheduler(AsyncScheduler):
    """vLLM's `AsyncScheduler`, which passes each deferred request the drafts its worker proposed for it."""

    def __init__(self, *args, **kwargs) -> None:
        missing = [name for name in HOOKS if not any(name in vars(cls) for cls in (AsyncScheduler, Scheduler))]
        if missing:
            raise RuntimeError(f"vLLM's AsyncScheduler has no {', '.join(missing)}: the kit's scheduler "
                               "(submission.reasoning.engines.vllm_scheduler) would never see the drafts; this vLLM "
                               "is not the release the kit was checked against (0.33.0)")
        super().__init__(*args, **kwargs)
        self.scheduled_steps: dict[str, int] = {}  # request -> steps it has been scheduled in
        self.kept_drafts: dict[str, tuple[int, list[int]]] = {}  # request -> (its scheduled steps then, its drafts)

    def schedule(self, *args, **kwargs):
        scheduler_output = super().schedule(*args, **kwargs)
        for req_id in scheduler_output.num_scheduled_tokens:
            self.scheduled_steps[req_id] = self.scheduled_steps.get(req_id, 0) + 1
        for req_id in scheduler_output.finished_req_ids:  # finished or aborted since the last step
            self.scheduled_steps.pop(req_id, None)
            self.kept_drafts.pop(req_id, None)
        return scheduler_output

    def update_draft_token_ids_in_output(self, draft_token_ids: DraftTokenIds, scheduler_output) -> None:
        scheduled = scheduler_output.scheduled_spec_decode_tokens
        req_ids, drafts = list(draft_token_ids.req_ids), list(draft_token_ids.draft_token_ids)
        for req_id, proposed in zip(req_ids, drafts):
            if req_id not in scheduled and req_id in self.scheduled_steps:
                self.kept_drafts[req_id] = (self.scheduled_steps[req_id], list(proposed))
        given = set(req_ids)
        for req_id in scheduled:
            kept = self.kept_drafts.pop(req_id, None)
            if req_id not in given and kept is not None and kept[0] + 1 == self.scheduled_steps.get(req_id):
                req_ids.append(req_id)
                drafts.append(kept[1])
        super().update_draft_token_ids_in_output(DraftTokenIds(req_ids, drafts), scheduler_output)
