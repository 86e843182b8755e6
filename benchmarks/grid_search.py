"""The grid search seeded with the best answer so far (issue 29), against the same search unseeded, against the
search on transformers' DynamicCache (a torch.cat of the whole cache per token), and against the naive baseline:
`generate` per view, the prompt prefilled again for each, on one tiny grid model, one thread.

    python benchmarks/grid_search.py [--confidence 7] [--cutoff 0.2] [--repeats 3]
    python benchmarks/grid_search.py --device cuda --dtype bfloat16 --width 4b --layers 8   # GPU (.ci/gpu-checks)
    python benchmarks/grid_search.py --lockstep [--contexts 2048,8192,13312] [--steps 24] [--repeats 3]

Workload: the ARC-AGI-2 evaluation task with the shortest encoding (e8686506, an 8 x 5 answer), its first test
input under the study's 16 search views (8 dihedral x 2 colour permutations), searched one view after the other as
solve_task searches them, on build.models.tiny's Qwen3 cut by build.models.grid_vocab (or at Qwen3-4B's widths, `--width
4b`, with `--layers` layers: benchmarks/grid_ttt.py's `grid_checkpoint`). A random tiny model finds no answer (nor
does one after a few hundred TTT steps: too small to learn the task), while a trained model finds the same answer in
most views, which is what seeding exploits. So the model stands in for a trained one (`Confident`): its
log-probabilities plus `--confidence` nats on the labelled answer's next token while the path follows the label (in
the view's frame). Every model call is the tiny model's own; only the scores are steered.

Variants, all in every round, the order reversed every other round, `--repeats` rounds:

    dynamic   unseeded, transformers' DynamicCache (today's transformers default; the kit before issue 29)
    plain     unseeded, the preallocated cache (submission.grid.model)
    seeded    each view seeded with the best answer so far (most hits, then most probable), mapped into the view
    generate  `model.generate` greedy per view, re-prefilled, as many new tokens as the view's search tree holds

The three searches must find the same answers with the same log-probabilities in every view. Tokens per second
are the search tree's tokens (the same tree for all three, `plain`'s model steps) over the wall time, prompts
included; `generate` decodes the same number of tokens per view. Targets: seeded faster than plain (median ratio
of the rounds >= 1), and the seeded search's tokens per second at least generate's. In bfloat16 the
log-probabilities may differ by float rounding between the variants (a guess prefilled in one call, a cache read
from a buffer): they must agree within `LOGP_TOLERANCE` of the dtype.

`--lockstep` (issue 45) measures the search's decode steps at long contexts instead: two views of a long task, each
cut to `--contexts` tokens less the answer's room, on a model of
Qwen3-4B's attention layout (`--width 4b-heads` by default: 32 query / 8 KV heads of 128, a narrow residual stream),
each view walking the same `--steps`-token path with a branch return every 8 steps (3 tokens back, view 0 only, so
the rows' lengths differ as a search's do). No ARC-AGI-2 evaluation task fills 13K tokens (the longest encodes to
~7.6K), so the long task is made of real grids: the evaluation set's largest demonstration pairs, from any task, as one
task's demonstrations (`long_task`); only the prompt's length matters to a decode step's cost. Variants, interleaved
over `--repeats` rounds:

    one view  HFStepper, one view after the other (no mask: transformers' SDPA attends with enable_gqa: no copy on
              CUDA's flash kernel; on a CPU torch's SDPA repeats the KV heads inside (its docs: grouped-query
              attention works only for flash and math on CUDA), counted by arithmetic, not by the wrapper)
    repeat    HFBatchStepper's lockstep on transformers' SDPA path (grouped=False): its mask makes it repeat_kv
    grouped   HFBatchStepper's lockstep as the search runs it: grouped_decode_attention, no copy

Per step it counts the copies (repeat_kv's calls and the bytes they write, counted by wrapping it) and the bytes moved
by arithmetic: the weights once per model call, each cache slot's keys and values read once, and a copy's bytes read
from the cache, written, and read again by attention. Tokens per second are decode tokens (views x steps) over the
decode time (the prompts are prefilled once per context and shared by the variants: prefill is the same work in all,
and on CPU it would dominate). Each variant's log-probabilities must match one view's within `LOGP_TOLERANCE`.
Target: grouped lockstep at least as fast as one view at a time at the longest context (median ratio of the rounds).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402
from transformers import DynamicCache  # noqa: E402

import transformers.integrations.sdpa_attention as sdpa_attention  # noqa: E402

import submission.grid.model as grid_model  # noqa: E402
from submission.grid.dfs import search  # noqa: E402
from submission.grid.format import EOS, PAD, decode_grid, encode, grid_ids  # noqa: E402
from submission.grid.queue import task_cost  # noqa: E402
from submission.grid.rescore import search_views  # noqa: E402
from submission.grid.solve import best_answer  # noqa: E402
from submission.tasks import Task, load_tasks  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from grid_ttt import WIDTHS, grid_checkpoint  # noqa: E402
from targets import Targets, spread  # noqa: E402

ARC = Path(os.environ.get("ARC_DATA", Path(__file__).resolve().parents[2] / "shared" / "arc-data"))
LOGP_TOLERANCE = {"float32": 1e-4, "bfloat16": 0.05, "float16": 0.05}  # nats, between the searches' answers


class Confident:
    """A `dfs.Stepper`: the tiny model's (HFStepper's) log-probabilities, plus `bonus` nats on `answer`'s next token
    wherever the path after the prompt is a prefix of `answer`, renormalised."""

    def __init__(self, inner, answer: tuple[int, ...], bonus: float):
        self.inner, self.answer, self.bonus = inner, answer, bonus
        self.base, self.path = 0, []

    @property
    def length(self) -> int:
        return self.inner.length

    def _steer(self, logp: np.ndarray, path: list[int]) -> np.ndarray:
        if len(path) < len(self.answer) and tuple(path) == self.answer[:len(path)]:
            logp = logp.copy()
            logp[self.answer[len(path)]] += self.bonus
            logp -= np.logaddexp.reduce(logp)
        return logp

    def prefill(self, ids, guess=()):
        self.base, self.path = len(ids), list(guess)
        rows = self.inner.prefill(ids, guess)
        return np.stack([self._steer(row, list(guess[:i])) for i, row in enumerate(rows)])

    def push(self, token: int) -> np.ndarray:
        self.path.append(token)
        return self._steer(self.inner.push(token), self.path)

    def truncate(self, length: int) -> None:
        self.inner.truncate(length)
        del self.path[length - self.base:]


def search_views_in_turn(model, views, prompts, label, bonus: float, cutoff: float, seeded: bool) -> list:
    """solve_task's loop for one test input: view after view, each seeded (or not) with the best answer so far."""
    hits, logps, results = Counter(), {}, []
    for view, prompt in zip(views, prompts):
        best = best_answer(hits, logps) if seeded else None
        guess = (*grid_ids(view.apply_grid(best)), EOS) if best is not None else ()
        stepper = Confident(grid_model.HFStepper(model), (*grid_ids(view.apply_grid(label)), EOS), bonus)
        result = search(stepper, prompt, cutoff, guess=guess)
        for found in result.found:
            grid = view.invert_grid(decode_grid(found.tokens))
            hits[grid] += 1
            logps[grid] = max(logps.get(grid, found.logp), found.logp)
        results.append(result)
    return results


def on_dynamic_cache(run):
    """`run` with the search's caches made as transformers makes them (DynamicLayer: torch.cat per token)."""
    preallocated = grid_model._new_cache
    grid_model._new_cache = lambda model, capacity: DynamicCache(config=model.config)
    try:
        return run()
    finally:
        grid_model._new_cache = preallocated


@torch.no_grad()
def generate_per_view(model, prompts, tokens: list[int]) -> int:
    for prompt, n in zip(prompts, tokens):
        model.generate(input_ids=torch.tensor([prompt], device=model.device),
                       attention_mask=torch.ones((1, len(prompt)), dtype=torch.long, device=model.device),
                       max_new_tokens=max(n, 1), min_new_tokens=max(n, 1), do_sample=False, pad_token_id=PAD)
    return sum(max(n, 1) for n in tokens)


@contextlib.contextmanager
def prefilled_once():
    """grid_model._padded_prefill memoised by its arguments: each prompt is prefilled once for all variants."""
    real, memo = grid_model._padded_prefill, {}

    def once(model, prompts, scored=None, room=0):
        key = (tuple(map(tuple, prompts)), tuple(scored or ()), room)
        if key not in memo:
            memo[key] = real(model, prompts, scored, room)
        return memo[key]

    grid_model._padded_prefill = once
    try:
        yield
    finally:
        grid_model._padded_prefill = real


class Copies:
    """repeat_kv's calls and the bytes they write, counted while active (sdpa_attention_forward looks it up in its
    module at every call)."""

    def __init__(self):
        self.calls = self.written = 0

    def __enter__(self):
        self.real = sdpa_attention.repeat_kv

        def counted(hidden, n_rep):
            out = self.real(hidden, n_rep)
            if n_rep > 1:
                self.calls += 1
                self.written += out.numel() * out.element_size()
            return out

        sdpa_attention.repeat_kv = counted
        return self

    def __exit__(self, *exc):
        sdpa_attention.repeat_kv = self.real


def walk(prompt_len: int, steps: int, back: bool) -> list[tuple[int, int]]:
    """A view's moves (cache length, token): colour tokens one after another, every 8th step 3 tokens back if
    `back`."""
    moves, length = [], prompt_len
    for i in range(steps):
        if back and i and i % 8 == 0:
            length -= 3
        moves.append((length, 1 + i % 9))
        length += 1
    return moves


def one_view_at_a_time(model, prompts, paths) -> tuple[list, float]:
    stepper, out, seconds = grid_model.HFStepper(model), [], 0.0
    for prompt, path in zip(prompts, paths):
        stepper.preload([prompt])
        stepper.prefill(prompt)
        t = time.perf_counter()
        for length, token in path:
            if stepper.length != length:
                stepper.truncate(length)
            out.append(stepper.push(token))
        seconds += time.perf_counter() - t
    return out, seconds


def lockstep(model, prompts, paths, grouped: bool) -> tuple[list, float]:
    stepper = grid_model.HFBatchStepper(model, grouped=grouped)
    stepper.prefill(prompts)
    rows: list[list] = [[] for _ in prompts]
    t = time.perf_counter()
    for moves in zip(*paths):
        for row, logp in enumerate(stepper.push([(r, length, token) for r, (length, token) in enumerate(moves)])):
            rows[row].append(logp)
    return [logp for row in rows for logp in row], time.perf_counter() - t


def moved_per_step(model, slots: list[int], copy_bytes: float, calls: int) -> float:
    """Bytes one model call moves, by arithmetic: the weights, every row's cache slots (keys and values, each layer),
    and the copies: read from the cache, written, read again by attention."""
    c = model.config
    element = next(model.parameters()).element_size()
    weights = sum(p.numel() for p in model.parameters()) * element
    cache = sum(slots) * c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * element
    groups = c.num_attention_heads // c.num_key_value_heads
    return weights + cache + copy_bytes * (2 + 1 / groups) if calls else weights + cache


def long_task(tasks) -> Task:
    """The evaluation set's demonstration pairs, largest first, as one task's demonstrations (its test input the
    largest pair's input): a prompt long enough to be cut to any context."""
    pairs = sorted((pair for task in tasks for pair in task.train),
                   key=lambda pair: -(len(pair.input) * len(pair.input[0]) + len(pair.output) * len(pair.output[0])))
    return Task("long", tuple(pairs[:24]), (pairs[0].input,))


def lockstep_main(args, targets: Targets) -> int:
    """--lockstep (module docstring)."""
    root = Path(tempfile.mkdtemp(prefix="grid-lockstep-bench-"))
    width = "4b-heads" if args.width == "tiny" else args.width
    model = grid_model.load_model(grid_checkpoint(root, width, args.layers), args.dtype, args.device)
    task = long_task(load_tasks(ARC / "arc-agi-2" / "evaluation").tasks)
    views = search_views(task, 8, 2, seed=0)[:2]
    c = model.config
    print(f"the evaluation set's largest pairs as one task, views 0-1; {c.num_attention_heads} query / "
          f"{c.num_key_value_heads} KV heads of {c.head_dim}, {c.num_hidden_layers} layers, hidden {c.hidden_size}; {args.dtype} on "
          f"{args.device}; {args.steps} decode steps per view; {args.repeats} interleaved rounds, medians (min-max)")
    ratios: dict[int, list[float]] = {}
    for context in args.contexts:
        prompts = [encode(shown.train, shown.test_inputs[0], max_len=context - grid_model.ANSWER_ROOM).ids
                   for shown in (v.apply(task) for v in views)]
        paths = [walk(len(p), args.steps, back=row == 0) for row, p in enumerate(prompts)]
        variants = {"one view": lambda: one_view_at_a_time(model, prompts, paths),
                    "repeat": lambda: lockstep(model, prompts, paths, grouped=False),
                    "grouped": lambda: lockstep(model, prompts, paths, grouped=True)}
        seconds: dict[str, list[float]] = {name: [] for name in variants}
        copies: dict[str, Copies] = {}
        with prefilled_once():
            reference = None
            for round_ in range(args.repeats):
                for name in list(variants) if round_ % 2 == 0 else list(variants)[::-1]:
                    with Copies() as counted:
                        logps, s = variants[name]()
                    seconds[name].append(s)
                    copies[name] = counted
                    reference = reference if reference is not None else (name, logps)
                    worst = max(float(np.abs(a - b).max()) for a, b in zip(reference[1], logps))
                    assert worst < LOGP_TOLERANCE[args.dtype], f"{name}: log-probabilities differ by {worst}"
        tokens = len(prompts) * args.steps
        width_slots = max(len(p) for p in prompts) + args.steps  # a lockstep row's slots, masked ones included
        print(f"context {context}: prompts {' and '.join(str(len(p)) for p in prompts)} tokens")
        for name, times in seconds.items():
            calls = len(prompts) * args.steps if name == "one view" else args.steps
            per_call = copies[name].written / calls
            slots = ([len(p) + args.steps // 2 for p in prompts[:1]] if name == "one view"
                     else [width_slots] * len(prompts))
            inside = 0.0  # a CPU's SDPA copies the KV heads itself for enable_gqa (module docstring)
            if name == "one view" and args.device == "cpu":
                inside = moved_per_step(model, slots, 0.0, 0) - moved_per_step(model, [0], 0.0, 0)
                inside *= c.num_attention_heads // c.num_key_value_heads
            moved = moved_per_step(model, slots, per_call + inside, copies[name].calls or inside > 0)
            ratio = (f"  -> {spread([o / s for o, s in zip(seconds['one view'], times)])}x one view"
                     if name != "one view" else "")
            torch_copies = f" (+ ~{inside / 2**20:.0f} MiB inside torch's CPU SDPA)" if inside else ""
            rate = spread([tokens / s for s in times])
            print(f"  {name:8s} {rate} tok/s; per model call {copies[name].calls // calls} repeat_kv copies, "
                  f"{per_call / 2**20:.0f} MiB copied{torch_copies}, ~{moved / 2**20:.0f} MiB moved{ratio}")
        ratios[context] = [o / g for o, g in zip(seconds["one view"], seconds["grouped"])]
    longest = max(args.contexts)
    targets.at_least(f"grouped lockstep / one view at a time at {longest} tokens, tok/s (median)",
                     statistics.median(ratios[longest]), 1.0)
    return targets.exit_code()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--confidence", type=float, default=7.0, help="nats added to the label's next token")
    parser.add_argument("--cutoff", type=float, default=0.2)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=sorted(LOGP_TOLERANCE))
    parser.add_argument("--width", default="tiny", choices=sorted(WIDTHS))
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--lockstep", action="store_true", help="lockstep against one view at a time (docstring)")
    parser.add_argument("--contexts", type=lambda s: [int(x) for x in s.split(",")], default=[2048, 8192, 13312])
    parser.add_argument("--steps", type=int, default=24, help="--lockstep: decode steps per view")
    args = parser.parse_args()
    targets = Targets()
    torch.set_num_threads(1)
    if args.lockstep:
        return lockstep_main(args, targets)
    root = Path(tempfile.mkdtemp(prefix="grid-search-bench-"))
    task = min(load_tasks(ARC / "arc-agi-2" / "evaluation").tasks, key=task_cost)
    model = grid_model.load_model(grid_checkpoint(root, args.width, args.layers), args.dtype, args.device)
    views = search_views(task, 8, 2, seed=0)
    prompts = [encode(shown.train, shown.test_inputs[0], max_len=4096).ids for shown in (v.apply(task) for v in views)]
    label = task.test_outputs[0]
    print(f"task {task.id}: {len(views)} views, prompts {min(map(len, prompts))}-{max(map(len, prompts))} tokens, "
          f"answer {len(label)} x {len(label[0])}; confidence {args.confidence} nats; {args.dtype} on {args.device}, "
          f"width {args.width}, {args.layers} layers")

    def searches(seeded: bool):
        return lambda: search_views_in_turn(model, views, prompts, label, args.confidence, args.cutoff, seeded)

    variants = {"dynamic": lambda: on_dynamic_cache(searches(False)), "plain": searches(False),
                "seeded": searches(True)}
    reference = variants["plain"]()
    tree = [r.steps for r in reference]
    variants["generate"] = lambda: generate_per_view(model, prompts, tree)
    seconds: dict[str, list[float]] = {name: [] for name in variants}
    calls: dict[str, int] = {}
    for round_ in range(args.repeats):
        for name in list(variants) if round_ % 2 == 0 else list(variants)[::-1]:
            t = time.perf_counter()
            results = variants[name]()
            seconds[name].append(time.perf_counter() - t)
            if name == "generate":
                continue
            calls[name] = sum(r.steps for r in results)
            for one, other in zip(reference, results):
                assert [f.tokens for f in other.found] == [f.tokens for f in one.found], f"{name}: other answers"
                assert all(abs(a.logp - b.logp) < LOGP_TOLERANCE[args.dtype]
                           for a, b in zip(one.found, other.found)), name
                assert other.complete
    answers = sum(len(r.found) for r in reference)
    print(f"search tree: {sum(tree)} tokens over {len(views)} views, {answers} answers (cut-off {args.cutoff}); "
          f"{args.repeats} interleaved rounds, medians (min-max)")
    for name, times in seconds.items():
        model_calls = f", {calls[name]} decode calls" if name in calls else ", re-prefilled per view"
        ratio = (f"  -> {spread([p / s for p, s in zip(seconds['plain'], times)])}x plain" if name != "plain" else "")
        print(f"  {name:9s} {spread([sum(tree) / t for t in times])} tok/s ({spread(times)} s{model_calls}){ratio}")
    targets.at_least("seeded / plain, time (median)",
                     statistics.median(p / s for p, s in zip(seconds["plain"], seconds["seeded"])), 1.0)
    targets.at_least("seeded search / generate per view, tok/s (median)",
                     statistics.median(g / s for g, s in zip(seconds["generate"], seconds["seeded"])), 1.0)
    return targets.exit_code()


if __name__ == "__main__":
    sys.exit(main())
