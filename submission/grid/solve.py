"""One task on one worker: test-time training, then per test input the search under 16 views and the rescoring.

The task's time limit is split as the study did: training takes at most `ttt.share` of it (the steps that fit are
planned before it starts and all run: submission.grid.ttt); the rest goes to the test inputs in equal parts. Each part is searched (all but its `rescore.share`) in batches of views
(`search.views_per_batch`, at most `search.batch_s` each) and then rescored. Within a batch, `search.dfs_batch` views
at a time walk their trees in lockstep, one model call per step for all of them (1: one view after the other);
`search.preload` prefills the prompts searched together (the whole batch when dfs_batch is 1) in one model call.
At a deadline the search stops where it is and the rescoring keeps the views it finished (none: nll 0, ranked by
hits); every loop checks its deadline before each model call, so a task overruns its limit by at most one forward
pass (with dfs_batch > 1, one pass of the group).

If no view finds an answer above the cut-off (a model not yet adapted to the task), the greedy answer under the
plain view is the input's only candidate, with 0 hits: an answer beats an empty slot. This fallback is the kit's,
not the study's.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

from submission.grid.config import GridProfile
from submission.grid.dfs import greedy, search, search_batch
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


def solve_task(adapter: Adapter, task: Task, profile: GridProfile, max_len: int, time_limit: float,
               clock: Callable[[], float] = time.monotonic) -> TaskOutcome:
    from submission.grid.model import HFBatchStepper, HFStepper, answer_nlls  # torch: only in the worker processes

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
                stepper.preload(prompts)  # the batch's prompts in one model call
            group = profile.search.dfs_batch
            for at in range(0, len(batch), group):
                if clock() >= search_deadline:
                    complete = False
                    break
                if group == 1:
                    results = [search(stepper, prompts[at], profile.search.cutoff, profile.search.max_side,
                                      batch_deadline, clock)]
                else:  # a fresh stepper per group: the last group's cache is freed before this one's prefill
                    results = search_batch(HFBatchStepper(model, profile.search.preload), prompts[at:at + group],
                                           profile.search.cutoff, profile.search.max_side, batch_deadline, clock)
                for view, result in zip(batch[at:at + group], results):
                    steps += result.steps
                    complete &= result.complete
                    for found in result.found:  # the grammar admits only grids: decoding cannot fail
                        hits[view.invert_grid(decode_grid(found.tokens))] += 1
        stepper.forget()
        if not hits and clock() < input_deadline:  # nothing cleared the cut-off anywhere: the greedy answer
            prompt = encode(task.train, task.test_inputs[index], max_len=prompt_len).ids
            fallback = greedy(stepper, prompt, profile.search.max_side, input_deadline, clock)
            if fallback is not None:
                hits[decode_grid(fallback.tokens)] = 0
        t1 = clock()
        stage["search"] += t1 - t0
        views = rescoring_views(task, profile.rescore.views, seed)
        candidates = rescore(task, index, dict(hits), views, lambda items: answer_nlls(model, items), max_len,
                             input_deadline, clock, profile.rescore.batch)
        stage["rescore"] += clock() - t1
        out.append(tuple(rank(candidates)))
    return TaskOutcome(task.id, tuple(out), dict(stage), report.steps, report.planned, report.losses, steps,
                       complete)
