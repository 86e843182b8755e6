"""One task on one worker: test-time training, then per test input the search under 16 views and the rescoring.

The task's time limit is split as the study did: training takes at most `ttt.share` of it (the steps that fit are
planned before it starts and all run: submission.grid.ttt); the rest goes to the test inputs in equal parts. Each
part is searched (all but its `rescore.share`) in batches of views (`search.views_per_batch`, at most
`search.batch_s` each) and then rescored. Within a batch, `search.dfs_batch` views
at a time walk their trees in lockstep, one model call per step for all of them (1: one view after the other);
`search.preload` prefills the prompts searched together (the whole batch when dfs_batch is 1) in one model call.
At a deadline the search stops where it is and the rescoring keeps the views it finished (none: nll 0, ranked by
hits); every loop checks its deadline before each model call, so a task overruns its limit by at most one forward
pass (with dfs_batch > 1, one pass of the group).

A CUDA out-of-memory error retries its stage smaller and keeps the finished work (issue 29): the training retries the
step with checkpointing (submission.grid.ttt); a lockstep search group searches its views one at a time; a
rescoring call is halved down to one sequence, and one that does not fit leaves the candidates ranked by hits.

If no view finds an answer above the cut-off (a model not yet adapted to the task), the greedy answer under the
plain view is the input's only candidate, with 0 hits: an answer beats an empty slot. This fallback is the kit's,
not the study's.
"""

from __future__ import annotations

import math
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from submission.grid.config import GridProfile
from submission.grid.dfs import SearchResult, greedy, search, search_batch
from submission.grid.format import decode_grid, encode
from submission.grid.rescore import Candidate, rank, rescore, rescoring_views, search_views
from submission.grid.ttt import Adapter, training_sequences
from submission.tasks import Task


@dataclass(frozen=True)
class TaskOutcome:
    task_id: str
    candidates: tuple[tuple[Candidate, ...], ...]  # per test input, best first
    stage_s: dict  # seconds: ttt, search, rescore
    ttt_steps: int
    ttt_planned: int
    ttt_losses: tuple[float, ...]
    search_steps: int  # model steps the search ran (after the prompts)
    complete: bool  # every search and rescoring finished within the limit


def _alone(stepper, prompt, profile: GridProfile, deadline: float, clock) -> SearchResult:
    """One view's search after its lockstep group ran out of memory; out of memory alone too: nothing, incomplete."""
    from submission.grid.model import OutOfMemory, release

    try:
        return search(stepper, prompt, profile.search.cutoff, profile.search.max_side, deadline, clock)
    except OutOfMemory:
        release(stepper.model)
        return SearchResult((), False, 0)


def solve_task(adapter: Adapter, task: Task, profile: GridProfile, max_len: int, time_limit: float,
               clock: Callable[[], float] = time.monotonic,
               log: Callable[[str], None] = lambda line: print(line, file=sys.stderr)) -> TaskOutcome:
    from submission.grid.model import (HFBatchStepper, HFStepper, OutOfMemory, answer_nlls,  # torch: workers only
                                       release, split_on_oom)

    start = clock()
    deadline = start + time_limit
    seed = profile.rescore.seed
    sequences = training_sequences(task, profile.ttt, max_len, seed)
    adapter.reset()
    report = adapter.train(sequences, profile.ttt.share * time_limit, clock)
    model = adapter.model
    stepper = HFStepper(model)
    prompt_len = max_len - profile.run.answer_room
    stage = Counter(ttt=report.seconds)
    out, steps, complete = [], 0, True
    for index in range(len(task.test_inputs)):
        input_deadline = clock() + (deadline - clock()) / (len(task.test_inputs) - index)
        t0 = clock()
        search_deadline = input_deadline - profile.rescore.share * (input_deadline - t0)
        hits: Counter = Counter()
        views = search_views(task, profile.search.dihedrals, profile.search.colour_perms, seed)
        size = max(profile.search.views_per_batch, 1)
        for first in range(0, len(views), size):
            batch_deadline = min(clock() + profile.search.batch_s, search_deadline)
            batch = views[first:first + size]
            prompts = [encode(shown.train, shown.test_inputs[index], max_len=prompt_len).ids
                       for shown in (view.apply(task) for view in batch)]
            if profile.search.dfs_batch == 1 and profile.search.preload and clock() < search_deadline:
                try:
                    stepper.preload(prompts)  # the batch's prompts in one model call
                except OutOfMemory:  # each prompt prefilled as its search starts instead
                    stepper.forget()
                    release(model)
                    log(f"task {task.id}: preloading {len(prompts)} prompts ran out of memory: one at a time")
            group = profile.search.dfs_batch
            for at in range(0, len(batch), group):
                if clock() >= search_deadline:
                    complete = False
                    break
                try:
                    if group == 1:
                        results = [search(stepper, prompts[at], profile.search.cutoff, profile.search.max_side,
                                          batch_deadline, clock)]
                    else:  # a fresh stepper per group: the last group's cache is freed before this one's prefill
                        results = search_batch(HFBatchStepper(model, profile.search.preload), prompts[at:at + group],
                                               profile.search.cutoff, profile.search.max_side, batch_deadline, clock)
                except OutOfMemory:  # the group's views one at a time; one that does not fit alone gives nothing
                    release(model)
                    log(f"task {task.id}: search out of memory on {len(prompts[at:at + group])} views: one at a time")
                    results = [_alone(stepper, prompt, profile, batch_deadline, clock)
                               for prompt in prompts[at:at + group]]
                for view, result in zip(batch[at:at + group], results):
                    steps += result.steps
                    complete &= result.complete
                    for found in result.found:  # the grammar admits only grids: decoding cannot fail
                        hits[view.invert_grid(decode_grid(found.tokens))] += 1
        stepper.forget()
        if not hits and clock() < input_deadline:  # nothing cleared the cut-off anywhere: the greedy answer
            prompt = encode(task.train, task.test_inputs[index], max_len=prompt_len).ids
            try:
                fallback = greedy(stepper, prompt, profile.search.max_side, input_deadline, clock)
            except OutOfMemory:
                release(model)
                log(f"task {task.id}: the greedy answer ran out of memory")
                fallback = None
            if fallback is not None:
                hits[decode_grid(fallback.tokens)] = 0
        t1 = clock()
        stage["search"] += t1 - t0
        views = rescoring_views(task, profile.rescore.views, seed)
        nlls = split_on_oom(lambda items: answer_nlls(model, items), model, log)
        try:
            candidates = rescore(task, index, dict(hits), views, nlls, max_len, input_deadline, clock,
                                 profile.rescore.batch)
        except OutOfMemory:  # one sequence does not fit: the candidates by their hits alone (nll 0)
            release(model)
            log(f"task {task.id}: rescoring out of memory on one sequence: ranked by hits")
            candidates = rescore(task, index, dict(hits), views, nlls, max_len, -math.inf, clock)
            complete = False
        stage["rescore"] += clock() - t1
        out.append(tuple(rank(candidates)))
    return TaskOutcome(task.id, tuple(out), dict(stage), report.steps, report.planned, report.losses, steps,
                       complete)
