"""One task on one worker: test-time training, then the search under 16 views per test input, then the rescoring.

The task's training runs all its steps within the task's whole limit when the run's forecast affords them (`plan`,
queue.TrainingPlan: NVARC always trains 128 steps), else in at most `ttt.share` of the limit (the steps that fit are
planned before it starts and all run: submission.grid.ttt); the outcome says how many ran and why fewer. Of the time
left, `rescore.share` is kept for the rescoring and the search has the remainder. The search runs in batches of views
(`search.views_per_batch`) taken in turn across the task's test inputs, as NVARC does (`search_order`): every input
has half its views searched before any has the rest, so a deadline leaves every input an answer. Each batch may
run `search.batch_s` at most and no more than an equal part of the search time still left, so one slow batch cannot
starve the others. Within a batch, `search.dfs_batch` views at a time walk their trees in lockstep, one model call
per step for all of them (1: one view after the other); `search.preload` prefills the prompts searched together
(the whole batch when dfs_batch is 1) in one model call. Every view is seeded with its input's best answer so far
(most hits, then the most probable), mapped into the view: its path costs one prefill (`dfs.search`'s guess;
`search.guess = false` searches unseeded, the same answers at more model steps: benchmarks/grid_learn.py's ablation).
The rescoring then gives each input an equal part of the time left. At a deadline the search stops where it is
and the rescoring keeps the views it finished (none: nll 0, ranked by hits); every loop checks its deadline before
each model call, so a task overruns its limit by at most one forward pass (with dfs_batch > 1, one pass of the
group). `complete` is true only if every search and every rescoring finished.

A CUDA out-of-memory error retries its stage smaller and keeps the finished work (issue 29): the training retries the
step with checkpointing (submission.grid.ttt); a preload falls back to one prompt at a time, a lockstep search group
searches its views one at a time; a rescoring call is halved down to one sequence, and one that does not fit leaves
the candidates ranked by hits.

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

from submission.grid.profile import GridProfile
from submission.grid.dfs import SearchResult, greedy, search, search_batch
from submission.grid.format import KIT16, GridFormat, answer_ids, decode_grid, encode
from submission.grid.queue import TrainingPlan
from submission.grid.rescore import Candidate, rescore, rescoring_views, search_views
from submission.grid.ttt import Adapter, training_sequences
from submission.grids import Grid
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
    ttt_checkpointing: bool = False  # the training's (TTTReport's): checkpointing on at its end
    ttt_oom_retries: int = 0
    ttt_skipped: int = 0  # steps whose sequence did not fit even with checkpointing
    ttt_sequences: int = 0  # the task's training sequences: the steps a full training runs
    ttt_why: str = ""  # the training plan's forecast, and why fewer steps were planned than sequences if so


def search_order(inputs: int, views: int, per_batch: int) -> list[tuple[int, int]]:
    """(test input, first view) of each search batch: batch k of every input before batch k + 1 of any."""
    return [(index, first) for first in range(0, views, per_batch) for index in range(inputs)]


def best_answer(hits: Counter, logps: dict[Grid, float]) -> Grid | None:
    """The answer to seed the next views with: the most hits, then the highest log-probability in any view."""
    return max(hits, key=lambda grid: (hits[grid], logps[grid]), default=None)


def _alone(stepper, prompt, guess, profile: GridProfile, deadline: float, clock, fmt: GridFormat) -> SearchResult:
    """One view's search after its lockstep group ran out of memory; out of memory alone too: nothing, incomplete."""
    from submission.grid.model import OutOfMemory, release

    try:
        return search(stepper, prompt, profile.search.cutoff, profile.search.max_side, deadline, clock, guess=guess,
                      fmt=fmt)
    except OutOfMemory:
        release(stepper.model)
        return SearchResult((), False, 0)


def solve_task(adapter: Adapter, task: Task, profile: GridProfile, max_len: int, time_limit: float,
               clock: Callable[[], float] = time.monotonic,
               log: Callable[[str], None] = lambda line: print(line, file=sys.stderr),
               fmt: GridFormat = KIT16, plan: TrainingPlan | None = None) -> TaskOutcome:
    """`fmt`: the checkpoint's format (read_format of profile.model), which every prompt, training sequence, search
    and rescoring goes through. `plan`: the queue's training plan for this task (None: `ttt.share` of the limit, as a
    plan that is not full)."""
    from submission.grid.model import (HFBatchStepper, HFStepper, OutOfMemory, answer_nlls,  # torch: workers only
                                       release, split_on_oom)

    start = clock()
    deadline = start + time_limit
    seed, config = profile.rescore.seed, profile.search
    sequences = training_sequences(task, profile.ttt, max_len, seed, fmt)
    adapter.reset()
    full = plan is not None and plan.full
    report = adapter.train(sequences, time_limit if full else profile.ttt.share * time_limit, clock,
                           log=lambda line: log(f"task {task.id}: {line}"))  # a worker's lines name their task
    why = "; ".join(w for w in (plan.why if plan else "no plan: the training's share of the limit", report.why) if w)
    log(f"task {task.id}: ttt planned {report.planned} and trained {report.steps} of {len(sequences)} steps ({why})")
    model = adapter.model
    stepper = HFStepper(model, profile.run.answer_room)
    prompt_len = max_len - profile.run.answer_room
    stage = Counter(ttt=report.seconds)
    inputs = len(task.test_inputs)
    hits: list[Counter] = [Counter() for _ in range(inputs)]
    logps: list[dict[Grid, float]] = [{} for _ in range(inputs)]
    steps, complete = 0, True
    t0 = clock()
    search_deadline = deadline - profile.rescore.share * (deadline - t0)
    views = search_views(task, config.dihedrals, config.colour_perms, seed)
    size = max(config.views_per_batch, 1)
    order = search_order(inputs, len(views), size)
    for done, (index, first) in enumerate(order):
        now = clock()
        if now >= search_deadline:
            complete = False
            break
        batch_deadline = min(now + config.batch_s, now + (search_deadline - now) / (len(order) - done))
        batch = views[first:first + size]
        prompts = [encode(shown.train, shown.test_inputs[index], max_len=prompt_len, fmt=fmt).ids
                   for shown in (view.apply(task) for view in batch)]
        if config.dfs_batch == 1 and config.preload:
            try:
                stepper.preload(prompts)  # the batch's prompts in one model call
            except OutOfMemory:  # each prompt prefilled as its search starts instead
                stepper.forget()
                release(model)
                log(f"task {task.id}: preloading {len(prompts)} prompts ran out of memory: one at a time")
        for at in range(0, len(batch), config.dfs_batch):
            if clock() >= batch_deadline:
                complete = False
                break
            group = batch[at:at + config.dfs_batch]
            best = best_answer(hits[index], logps[index]) if config.guess else None
            guesses = [answer_ids(view.apply_grid(best), fmt) if best is not None else () for view in group]
            try:
                if len(group) == 1:
                    results = [search(stepper, prompts[at], config.cutoff, config.max_side, batch_deadline, clock,
                                      guess=guesses[0], fmt=fmt)]
                else:  # a fresh stepper per group: the last group's cache is freed before this one's prefill
                    results = search_batch(HFBatchStepper(model, config.preload, room=profile.run.answer_room),
                                           prompts[at:at + len(group)], config.cutoff, config.max_side,
                                           batch_deadline, clock, guesses, fmt)
            except OutOfMemory:  # the group's views one at a time; one that does not fit alone gives nothing
                release(model)
                log(f"task {task.id}: search out of memory on {len(group)} views: one at a time")
                results = [_alone(stepper, prompt, guess, profile, batch_deadline, clock, fmt)
                           for prompt, guess in zip(prompts[at:at + len(group)], guesses)]
            for view, result in zip(group, results):
                steps += result.steps
                complete &= result.complete
                for found in result.found:  # the grammar admits only grids: decoding cannot fail
                    grid = view.invert_grid(decode_grid(found.tokens, fmt))
                    hits[index][grid] += 1
                    logps[index][grid] = max(logps[index].get(grid, found.logp), found.logp)
        stepper.forget()
    stage["search"] += clock() - t0
    out = []
    for index in range(inputs):
        t1 = clock()
        input_deadline = t1 + (deadline - t1) / (inputs - index)
        if not hits[index]:  # nothing cleared the cut-off anywhere: the greedy answer
            prompt = encode(task.train, task.test_inputs[index], max_len=prompt_len, fmt=fmt).ids
            try:
                fallback = greedy(stepper, prompt, config.max_side, input_deadline, clock, fmt)
            except OutOfMemory:
                release(model)
                log(f"task {task.id}: the greedy answer ran out of memory")
                fallback = None
            if fallback is None:
                complete = False
            else:
                hits[index][decode_grid(fallback.tokens, fmt)] = 0
        t2 = clock()
        stage["search"] += t2 - t1
        views = rescoring_views(task, profile.rescore.views, seed)
        nlls = split_on_oom(lambda items: answer_nlls(model, items), model, log)
        try:
            rescored = rescore(task, index, dict(hits[index]), views, nlls, max_len, input_deadline, clock,
                               profile.rescore.batch, fmt)
        except OutOfMemory:  # one sequence does not fit: the candidates by their hits alone (nll 0)
            release(model)
            log(f"task {task.id}: rescoring out of memory on one sequence: ranked by hits")
            rescored = rescore(task, index, dict(hits[index]), views, nlls, max_len, -math.inf, clock, fmt=fmt)
            complete = False
        complete &= rescored.complete
        stage["rescore"] += clock() - t2
        out.append(rescored.candidates)
    return TaskOutcome(task.id, tuple(out), dict(stage), report.steps, report.planned, report.losses, steps,
                       complete, report.checkpointing, report.oom_retries, report.skipped, len(sequences), why)
