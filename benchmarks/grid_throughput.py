"""The grid line on CPU: TTT steps per second, search tokens per second with KV-cache reuse against re-running
the whole prefix per step and against transformers' plain `generate`, the rescoring batched (8 views per model
call) against one sequence per call, and the search of a test input's views in lockstep (`search.dfs_batch`) against
view by view, on one tiny grid model, one thread.

    python benchmarks/grid_throughput.py [--steps 16] [--cutoff 0.02] [--dfs-batch 2,4,8] [--repeats 5]

Workload: build.models.tiny's Qwen3 cut by build.models.grid_vocab (output head scaled x25 so that the search branches,
as a trained model's does), the ARC-AGI-2 evaluation task with the shortest encoding under a real prompt. Baselines in
the same run: (a) the same search with no cache (each model call re-runs prompt + prefix: what re-prefilling per
branch costs), (b) `model.generate` greedy decoding, the plain path, in tokens per second. Peak memory is the
process's maximum resident set size (one worker's share on CPU).

The lockstep search: grid-tiny's 8 search views of the same test input (4 dihedral x 2 colour permutations), searched
one view after the other (`search`, dfs_batch 1) and in groups of each `--dfs-batch` size (`search_batch`), all sizes
in every round, the order reversed every other round, `--repeats` rounds; the answers and steps must be the same, and
the target is on grid-tiny's own dfs_batch (lockstep at least as fast as view by view, median of the rounds).
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

from build.models.grid_vocab import cut  # noqa: E402
from build.models.tiny import make_checkpoint  # noqa: E402
from submission.grid.dfs import search, search_batch  # noqa: E402
from submission.grid.format import encode  # noqa: E402
from submission.grid.model import HFBatchStepper, HFStepper, answer_nlls, load_model  # noqa: E402
from submission.grid.queue import task_cost  # noqa: E402
from submission.grid.rescore import rescore, rescoring_views, search_views  # noqa: E402
from submission.grid.ttt import Adapter, TTTConfig, training_sequences  # noqa: E402
from submission.profiles import load_grid_profile  # noqa: E402
from submission.tasks import load_tasks  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from targets import Targets, spread  # noqa: E402

ARC = Path(os.environ.get("ARC_DATA", Path(__file__).resolve().parents[2] / "shared" / "arc-data"))


class NoCacheStepper:
    """The baseline: every step runs prompt + prefix from scratch."""

    def __init__(self, model):
        self.model, self.ids = model, []

    @property
    def length(self):
        return len(self.ids)

    @torch.no_grad()
    def _run(self):
        logits = self.model(input_ids=torch.tensor([self.ids]), use_cache=False).logits[0, -1]
        return torch.log_softmax(logits.float(), -1).numpy()

    @torch.no_grad()
    def prefill(self, ids, guess=()):
        self.ids = [*ids, *guess]
        logits = self.model(input_ids=torch.tensor([self.ids]), use_cache=False).logits[0, len(ids) - 1:]
        return torch.log_softmax(logits.float(), -1).numpy()

    def push(self, token):
        self.ids.append(token)
        return self._run()

    def truncate(self, length):
        del self.ids[length:]


def lockstep_benchmark(model, task, cutoff: float, sizes: list[int], repeats: int, targets: Targets) -> None:
    """The views of one test input searched view by view and in lockstep groups, interleaved (module docstring)."""
    search_ = load_grid_profile("grid-tiny").search
    prompts = [encode(shown.train, shown.test_inputs[0], max_len=4096).ids
               for shown in (view.apply(task) for view in search_views(task, search_.dihedrals, search_.colour_perms,
                                                                       seed=0))]

    def run(size: int) -> list:
        if size == 1:
            return [search(HFStepper(model), prompt, cutoff) for prompt in prompts]
        return [r for at in range(0, len(prompts), size)
                for r in search_batch(HFBatchStepper(model), prompts[at:at + size], cutoff)]

    variants = [1, *sizes]
    seconds: dict[int, list[float]] = {size: [] for size in variants}
    reference = None
    for round_ in range(repeats):  # interleaved, so every variant sees the same machine state
        for size in variants if round_ % 2 == 0 else variants[::-1]:
            t = time.perf_counter()
            results = run(size)
            seconds[size].append(time.perf_counter() - t)
            outcome = [([f.tokens for f in r.found], r.steps, r.complete) for r in results]
            reference = reference or outcome
            assert outcome == reference, f"dfs_batch {size} found other answers than view by view"
    steps = sum(s for _, s, _ in reference)
    print(f"lockstep search: {len(prompts)} views of {task.id} (prompts {min(map(len, prompts))}-"
          f"{max(map(len, prompts))} tokens), {steps} steps, {sum(len(f) for f, _, _ in reference)} answers; "
          f"{repeats} interleaved rounds, medians (min-max)")
    for size in variants:
        ratios = [a / b for a, b in zip(seconds[1], seconds[size])]
        print(f"  dfs_batch {size:2d}  {spread([steps / t for t in seconds[size]])} tok/s "
              f"({spread(seconds[size])} s, prompts included)" + (f"  -> {spread(ratios)}x view by view"
                                                                    if size > 1 else ""))
    if search_.dfs_batch in sizes:
        ratio = statistics.median(a / b for a, b in zip(seconds[1], seconds[search_.dfs_batch]))
        targets.at_least(f"lockstep (grid-tiny's dfs_batch {search_.dfs_batch}) / view by view (median)", ratio, 1.0)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=16, help="TTT steps")
    parser.add_argument("--cutoff", type=float, default=0.02)
    parser.add_argument("--dfs-batch", default="2,4,8", help="lockstep group sizes to time against view by view")
    parser.add_argument("--repeats", type=int, default=5, help="interleaved rounds of the lockstep comparison")
    args = parser.parse_args()
    targets = Targets()
    torch.set_num_threads(1)
    root = Path(tempfile.mkdtemp(prefix="grid-bench-"))
    model_dir = cut(make_checkpoint(root / "base", "qwen3", seed=3), root / "grid")
    task = min(load_tasks(ARC / "arc-agi-2" / "evaluation").tasks, key=task_cost)
    model = load_model(model_dir, "float32")
    with torch.no_grad():
        model.lm_head.weight.mul_(25.0)
    prompt = encode(task.train, task.test_inputs[0], max_len=4096).ids
    print(f"task {task.id}: prompt {len(prompt)} tokens")

    t = time.perf_counter()
    cached = search(HFStepper(model), prompt, args.cutoff)
    cached_s = time.perf_counter() - t
    t = time.perf_counter()
    naive = search(NoCacheStepper(model), prompt, args.cutoff)
    naive_s = time.perf_counter() - t
    assert [f.tokens for f in cached.found] == [f.tokens for f in naive.found]
    t = time.perf_counter()
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=cached.steps or 64, do_sample=False,
                             eos_token_id=None, pad_token_id=13)
    gen_s = time.perf_counter() - t
    generated = out.shape[1] - len(prompt)
    print(f"search: {len(cached.found)} answers, {cached.steps} steps")
    print(f"  KV reuse   {cached.steps / cached_s:8.1f} tok/s ({cached_s:.2f} s, prompt included)")
    print(f"  no cache   {naive.steps / naive_s:8.1f} tok/s ({naive_s:.2f} s)  -> reuse is {naive_s / cached_s:.1f}x")
    print(f"  generate   {generated / gen_s:8.1f} tok/s ({gen_s:.2f} s, {generated} tokens greedy)"
          f"  -> search/generate {cached.steps / cached_s / (generated / gen_s):.2f}")

    label = task.test_outputs[0]
    hits = {label: 1, tuple(tuple((c + 1) % 10 for c in row) for row in label): 1, ((1, 2), (3, 4)): 1}
    views = rescoring_views(task, 8, seed=0)
    timed = {}
    for batch in (1, 8 * len(hits)):
        t = time.perf_counter()
        ranked = rescore(task, 0, hits, views, lambda items: answer_nlls(model, items), 4096, batch=batch).candidates
        timed[batch] = (time.perf_counter() - t, [c.nll for c in ranked])
    (one_s, one), (all_s, together) = timed.values()
    assert np.allclose(one, together, rtol=1e-5), (one, together)  # the same NLLs, up to float rounding
    calls = len(views) * len(hits)
    print(f"rescoring: {len(hits)} candidates x {len(views)} views: one sequence per call {calls / one_s:.1f} seq/s "
          f"({one_s:.2f} s), all {calls} in one call {calls / all_s:.1f} seq/s ({all_s:.2f} s) -> "
          f"batched is {one_s / all_s:.2f}x")

    lockstep_benchmark(model, task, args.cutoff, [int(n) for n in args.dfs_batch.split(",")], args.repeats, targets)

    config = TTTConfig(rank=8, sequences=args.steps, lr=1e-3)
    adapter = Adapter(load_model(model_dir, "float32"), config)
    sequences = training_sequences(task, config, 4096)
    report = adapter.train(sequences, clock=time.perf_counter)
    tokens = sum(len(s.ids) for s in sequences[:report.steps])
    print(f"TTT: {report.steps} steps in {report.seconds:.2f} s = {report.steps / report.seconds:.2f} steps/s "
          f"({tokens / report.seconds:.0f} tok/s), loss {report.losses[0]:.3f} -> {np.mean(report.losses[-4:]):.3f}")
    print(f"peak memory: {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")
    return targets.exit_code()


if __name__ == "__main__":
    sys.exit(main())
