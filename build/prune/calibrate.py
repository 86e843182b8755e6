"""Record routing statistics and REAP saliency of a mixture-of-experts model on calibration traces.

    python -m build.prune.calibrate --model DIR --traces traces.jsonl --out stats.npz [--device cpu]
                                    [--dtype float32] [--chunk-tokens 65536]
    python -m build.prune.calibrate merge a.npz b.npz --out all.npz

A trace is one JSON line: {"task_id", "token_ids", "segments": {"prompt": [0, p], "thinking": [p, t],
"answer": [t, n]}, "program": [a, b]} (half-open token ranges; the program lies inside the answer). The model runs on
each trace at batch 1 (transformers' modules, any device), one decoder layer at a time (build.layerwise: one layer's
weights resident, the hidden states of `--chunk-tokens` tokens of traces kept between layers), so an 80B MoE
calibrates in the memory of one layer. Forward hooks on each MoE block's experts record, per layer and expert:
routing decisions per trace and length bin, decisions on program tokens, and REAP saliency (gate value as the model
applies it x the L2 norm of the expert's output, summed over routed tokens; the expert output is recomputed in the
hook from the block's own weights). The MTP layer's router-row norms come from the checkpoint.
The output is saved every `--save-every` traces; rerunning with the same --out resumes after the traces already in
it, and `merge` adds statistics made on other machines (build.prune.stats refuses another model's).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np

from build.prune.stats import BINS, RoutingStats, bin_of, config_hash
from submission.progress import ProgressLine


def read_traces(path: str | Path) -> list[dict]:
    path = Path(path)
    traces = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            trace = json.loads(line)
            n = len(trace["token_ids"])
            for name in ("prompt", "thinking", "answer"):
                start, end = trace["segments"][name]
                if not 0 <= start <= end <= n:
                    raise ValueError(f"segment {name} [{start}, {end}) outside 0..{n}")
            trace.setdefault("program", [0, 0])
        except (json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
            raise ValueError(f"{path}:{number}: bad trace: {err}") from None
        traces.append(trace)
    return traces


def token_bins(trace: dict) -> np.ndarray:
    """The length bin of every token of a trace."""
    bins = np.full(len(trace["token_ids"]), len(BINS) - 1)
    p0, p1 = trace["segments"]["prompt"]
    t0, t1 = trace["segments"]["thinking"]
    bins[p0:p1] = bin_of("prompt", 0)
    bins[t0:t1] = [bin_of("thinking", i) for i in range(t1 - t0)]
    return bins


def is_moe_block(module) -> bool:
    return hasattr(module, "gate") and hasattr(module, "experts") and hasattr(module.experts, "gate_up_proj")


def expert_hook(layer: int, saliency_sum: np.ndarray, saliency_n: np.ndarray, selected: Callable[[np.ndarray], None]):
    """A forward hook for a MoE block's fused experts: hands the [tokens, top_k] routing decisions to `selected` and
    adds REAP saliency (gate value x norm of the expert output, recomputed from the block's weights) to row `layer`."""
    def hook(module, args, kwargs, output):
        import torch

        names = ("hidden_states", "top_k_index", "top_k_weights")
        hidden, index, weights = (list(args) + [kwargs[n] for n in names[len(args):]])[:3]
        selected(index.detach().cpu().numpy())
        with torch.no_grad():
            for expert in torch.unique(index).tolist():
                token, slot = torch.where(index == expert)
                gate, up = torch.nn.functional.linear(hidden[token], module.gate_up_proj[expert]).chunk(2, dim=-1)
                out = torch.nn.functional.linear(module.act_fn(gate) * up, module.down_proj[expert])
                contribution = weights[token, slot].float() * out.float().norm(dim=-1)
                saliency_sum[layer, expert] += float(contribution.sum())
                saliency_n[layer, expert] += len(token)
    return hook


class Recorder:
    """Forward hooks on the MoE blocks of a whole transformers model (Qwen3-MoE and Qwen3-Next layouts): the
    reference the layer-by-layer calibration is tested against, and the hooks' cost in benchmarks/."""

    def __init__(self, model):
        self.blocks = [m for _, m in model.named_modules() if is_moe_block(m)]
        if not self.blocks:
            raise ValueError("no mixture-of-experts blocks (a module with .gate and .experts.gate_up_proj) found")
        self.experts = self.blocks[0].experts.num_experts
        self.top_k = self.blocks[0].gate.top_k
        layers = len(self.blocks)
        self.saliency_sum = np.zeros((layers, self.experts))
        self.saliency_n = np.zeros((layers, self.experts))
        self._selected: list[np.ndarray | None] = [None] * layers
        self._handles = [block.experts.register_forward_hook(
            expert_hook(i, self.saliency_sum, self.saliency_n, lambda index, i=i: self._selected.__setitem__(i, index)),
            with_kwargs=True) for i, block in enumerate(self.blocks)]

    def selected(self) -> list[np.ndarray]:
        """Per layer, the [tokens, top_k] experts routed to in the last forward."""
        return list(self._selected)

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()


def mtp_router_norms(model_dir: Path) -> np.ndarray:
    from safetensors import safe_open

    index_path = model_dir / "model.safetensors.index.json"
    weight_map = json.loads(index_path.read_text())["weight_map"] if index_path.exists() else {}
    names = sorted(n for n in weight_map if re.search(r"^mtp\..*\.mlp\.gate\.weight$", n))
    rows = []
    for name in names:
        with safe_open(model_dir / weight_map[name], framework="pt") as f:
            rows.append(f.get_tensor(name).float().norm(dim=-1).numpy())
    return np.stack(rows) if rows else np.zeros((0, 0))


def count_decisions(trace: dict, selected: np.ndarray, counts: np.ndarray, program: np.ndarray) -> None:
    """Add one layer's routing decisions on one trace to its [bins, experts] counts and [experts] program counts."""
    bins = token_bins(trace)
    a, b = trace["program"]
    for k in range(selected.shape[1]):
        np.add.at(counts, (bins, selected[:, k]), 1)
        np.add.at(program, selected[a:b, k], 1)


class _ChunkRecorder:
    """`on_layer` for build.layerwise: hooks each MoE layer as it loads; the layer runs once per trace of the chunk,
    in order, so the n-th call of a hook is the chunk's n-th trace."""

    def __init__(self, row: dict[int, int], traces: list[dict], saliency_sum: np.ndarray, saliency_n: np.ndarray,
                 experts: int):
        self.row, self.traces, self.experts = row, traces, experts
        self.saliency_sum, self.saliency_n = saliency_sum, saliency_n
        self.group: list[int] | None = None
        self.counts: list[np.ndarray] = []
        self.program: list[np.ndarray] = []

    def __call__(self, index: int, layer, group: list[int]) -> list:
        if self.group is not group:
            self.group = group
            self.counts = [np.zeros((len(BINS), len(self.row), self.experts)) for _ in group]
            self.program = [np.zeros((len(self.row), self.experts)) for _ in group]
        if index not in self.row:
            return []
        r = self.row[index]
        calls = iter(range(len(group)))

        def selected(choice: np.ndarray) -> None:
            n = next(calls)
            count_decisions(self.traces[group[n]], choice, self.counts[n][:, r], self.program[n][r])

        return [layer.mlp.experts.register_forward_hook(expert_hook(r, self.saliency_sum, self.saliency_n, selected),
                                                        with_kwargs=True)]


def calibrate(model_dir: str | Path, traces: list[dict], out: str | Path, device: str = "cpu",
              dtype: str = "float32", save_every: int = 16, progress=None, chunk_tokens: int = 65536,
              on_step=None) -> RoutingStats:
    """Routing statistics of `traces`, layer by layer (build.layerwise: one decoder layer resident, the hidden states
    of at most `chunk_tokens` tokens of traces kept between layers), saved to `out` after every chunk once
    `save_every` new traces are in; resumes after the traces already in `out`."""
    from build.layerwise import LayerRunner

    model_dir, out = Path(model_dir), Path(out)
    config = json.loads((model_dir / "config.json").read_text())
    done = RoutingStats.load(out) if out.exists() else None
    if done is not None and done.config_hash != config_hash(config):
        raise ValueError(f"{out}: statistics of another model (config hash {done.config_hash})")
    runner = LayerRunner(model_dir, device, dtype)
    moe = [i for i, layer in enumerate(runner.layers) if is_moe_block(getattr(layer, "mlp", None))]
    if not moe:
        raise ValueError(f"{model_dir}: no mixture-of-experts blocks (a module with .gate and .experts.gate_up_proj)")
    row = {layer: position for position, layer in enumerate(moe)}
    first = runner.layers[moe[0]].mlp
    experts, top_k, layers = first.experts.num_experts, first.gate.top_k, len(moe)
    saliency_sum, saliency_n = np.zeros((layers, experts)), np.zeros((layers, experts))
    start = done.counts.shape[0] if done is not None else 0
    todo = traces[start:]
    counts, program_counts = [], []

    def snapshot() -> RoutingStats:
        new = RoutingStats(
            config_hash(config), top_k, np.array(counts).reshape(-1, len(BINS), layers, experts),
            np.array([np.bincount(token_bins(t), minlength=len(BINS)) for t in todo[:len(counts)]]).reshape(
                -1, len(BINS)),
            np.array(program_counts).reshape(-1, layers, experts),
            np.array([t["program"][1] - t["program"][0] for t in todo[:len(counts)]], dtype=float),
            saliency_sum.copy(), saliency_n.copy(), mtp_router_norms(model_dir),
            [t["task_id"] for t in todo[:len(counts)]])
        return done.merge(new) if done is not None else new

    saved = 0
    recorder = _ChunkRecorder(row, todo, saliency_sum, saliency_n, experts)
    for group, _ in runner.run([t["token_ids"] for t in todo], chunk_tokens, recorder, on_step):
        counts.extend(recorder.counts)
        program_counts.extend(recorder.program)
        if progress:
            progress(start + group[-1] + 1, len(traces))
        if len(counts) - saved >= save_every:
            snapshot().save(out)
            saved = len(counts)
    stats = snapshot() if counts else done
    stats.save(out)
    return stats


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["merge"]:
        parser = argparse.ArgumentParser(prog="python -m build.prune.calibrate merge")
        parser.add_argument("inputs", nargs="+", type=Path)
        parser.add_argument("--out", required=True, type=Path)
        args = parser.parse_args(argv[1:])
        merged = RoutingStats.load(args.inputs[0])
        for path in args.inputs[1:]:
            merged = merged.merge(RoutingStats.load(path))
        merged.save(args.out)
        print(f"{merged.counts.shape[0]} traces -> {args.out}")
        return 0
    parser = argparse.ArgumentParser(prog="python -m build.prune.calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--traces", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--save-every", type=int, default=16)
    parser.add_argument("--chunk-tokens", type=int, default=65536,
                        help="tokens of traces whose hidden states are kept between layers (memory: x hidden x 4 B)")
    args = parser.parse_args(argv)
    started = time.perf_counter()
    resident = [0]
    line = ProgressLine()

    def step(s) -> None:
        resident[0] = max(resident[0], s.resident_bytes)
        line.update(f"chunk {s.chunk + 1}, layer {s.layer + 1}")

    try:
        stats = calibrate(args.model, read_traces(args.traces), args.out, args.device, args.dtype, args.save_every,
                          chunk_tokens=args.chunk_tokens, on_step=step)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    finally:
        line.close()
    print(f"{stats.counts.shape[0]} traces, {int(stats.tokens.sum())} tokens in "
          f"{time.perf_counter() - started:.1f} s -> {args.out}; weights resident at most "
          f"{resident[0] / 1e6:.1f} MB, peak RSS {peak_rss_mb():.0f} MB")
    return 0


def peak_rss_mb() -> float:
    """This process's peak resident memory (Linux: ru_maxrss is in kB)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


if __name__ == "__main__":
    sys.exit(main())
