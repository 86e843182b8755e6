"""The grid search seeded with the best answer so far (issue 29), against the same search unseeded, against the
search on transformers' DynamicCache (a torch.cat of the whole cache per token), and against the naive baseline:
`generate` per view, the prompt prefilled again for each, on one tiny grid model, one thread.

    python benchmarks/grid_search.py [--confidence 7] [--cutoff 0.2] [--repeats 3]
    python benchmarks/grid_search.py --device cuda --dtype bfloat16 --width 4b --layers 8   # GPU (.ci/gpu-checks)

Workload: the ARC-AGI-2 evaluation task with the shortest encoding (e8686506, an 8 x 5 answer), its first test
input under the study's 16 search views (8 dihedral x 2 colour permutations), searched one view after the other as
solve_task searches them, on build.tiny's Qwen3 cut by build.grid_vocab (or at Qwen3-4B's widths, `--width 4b`, with `--layers` layers:
benchmarks/grid_ttt.py's `grid_checkpoint`). A random tiny model finds no answer (nor
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
"""

from __future__ import annotations

import argparse
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

import submission.grid.model as grid_model  # noqa: E402
from submission.grid.dfs import search  # noqa: E402
from submission.grid.format import EOS, PAD, decode_grid, encode, grid_ids  # noqa: E402
from submission.grid.queue import task_cost  # noqa: E402
from submission.grid.rescore import search_views  # noqa: E402
from submission.grid.solve import best_answer  # noqa: E402
from submission.tasks import load_tasks  # noqa: E402

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


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--confidence", type=float, default=7.0, help="nats added to the label's next token")
    parser.add_argument("--cutoff", type=float, default=0.2)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32", choices=sorted(LOGP_TOLERANCE))
    parser.add_argument("--width", default="tiny", choices=sorted(WIDTHS))
    parser.add_argument("--layers", type=int, default=2)
    args = parser.parse_args()
    targets = Targets()
    torch.set_num_threads(1)
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
