"""Record routing statistics and REAP saliency of a mixture-of-experts model on calibration traces.

    python -m build.calibrate --model DIR --traces traces.jsonl --out stats.npz [--device cpu] [--dtype float32]
    python -m build.calibrate merge a.npz b.npz --out all.npz

A trace is one JSON line: {"task_id", "token_ids", "segments": {"prompt": [0, p], "thinking": [p, t],
"answer": [t, n]}, "program": [a, b]} (half-open token ranges; the program lies inside the answer). The model runs on
each trace at batch 1 (transformers, any device). Forward hooks on every MoE block's router and experts record, per
layer and expert: routing decisions per trace and length bin, decisions on program tokens, and REAP saliency
(gate value as the model applies it x the L2 norm of the expert's output, summed over routed tokens; the expert output
is recomputed in the hook from the block's own weights). The MTP layer's router-row norms come from the checkpoint.
The output is saved every `--save-every` traces; rerunning with the same --out resumes after the traces already in
it, and `merge` adds statistics made on other machines (build.stats refuses another model's).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

import numpy as np

from build.stats import BINS, RoutingStats, bin_of, config_hash


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


class Recorder:
    """Forward hooks on the MoE blocks of a transformers model (Qwen3-MoE and Qwen3-Next layouts)."""

    def __init__(self, model):
        self.blocks = [m for _, m in model.named_modules() if hasattr(m, "gate") and hasattr(m, "experts")
                       and hasattr(m.experts, "gate_up_proj")]
        if not self.blocks:
            raise ValueError("no mixture-of-experts blocks (a module with .gate and .experts.gate_up_proj) found")
        self.experts = self.blocks[0].experts.num_experts
        self.top_k = self.blocks[0].gate.top_k
        layers = len(self.blocks)
        self.saliency_sum = np.zeros((layers, self.experts))
        self.saliency_n = np.zeros((layers, self.experts))
        self._selected: list[np.ndarray | None] = [None] * layers
        self._handles = [block.experts.register_forward_hook(self._hook(i), with_kwargs=True)
                         for i, block in enumerate(self.blocks)]

    def _hook(self, layer: int):
        def hook(module, args, kwargs, output):
            import torch

            names = ("hidden_states", "top_k_index", "top_k_weights")
            hidden, index, weights = (list(args) + [kwargs[n] for n in names[len(args):]])[:3]
            self._selected[layer] = index.detach().cpu().numpy()
            with torch.no_grad():
                for expert in torch.unique(index).tolist():
                    token, slot = torch.where(index == expert)
                    gate, up = torch.nn.functional.linear(hidden[token], module.gate_up_proj[expert]).chunk(2, dim=-1)
                    out = torch.nn.functional.linear(module.act_fn(gate) * up, module.down_proj[expert])
                    contribution = weights[token, slot].float() * out.float().norm(dim=-1)
                    self.saliency_sum[layer, expert] += float(contribution.sum())
                    self.saliency_n[layer, expert] += len(token)
        return hook

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


def calibrate(model_dir: str | Path, traces: list[dict], out: str | Path, device: str = "cpu",
              dtype: str = "float32", save_every: int = 16, progress=None) -> RoutingStats:
    import torch
    from transformers import AutoModelForCausalLM

    model_dir, out = Path(model_dir), Path(out)
    config = json.loads((model_dir / "config.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device).eval()
    recorder = Recorder(model)
    done = RoutingStats.load(out) if out.exists() else None
    if done is not None and done.config_hash != config_hash(config):
        raise ValueError(f"{out}: statistics of another model (config hash {done.config_hash})")
    start = done.counts.shape[0] if done is not None else 0
    layers, experts = len(recorder.blocks), recorder.experts
    counts, tokens, program_counts, program_tokens, task_ids = [], [], [], [], []

    def snapshot() -> RoutingStats:
        new = RoutingStats(
            config_hash(config), recorder.top_k,
            np.array(counts).reshape(-1, len(BINS), layers, experts), np.array(tokens).reshape(-1, len(BINS)),
            np.array(program_counts).reshape(-1, layers, experts), np.array(program_tokens, dtype=float),
            recorder.saliency_sum.copy(), recorder.saliency_n.copy(), mtp_router_norms(model_dir), list(task_ids))
        return done.merge(new) if done is not None else new

    for number, trace in enumerate(traces[start:], start):
        bins = token_bins(trace)
        ids = torch.tensor([trace["token_ids"]], device=device)
        with torch.no_grad():
            model(ids)
        c = np.zeros((len(BINS), layers, experts))
        pc = np.zeros((layers, experts))
        a, b = trace["program"]
        for layer, selected in enumerate(recorder.selected()):
            for k in range(selected.shape[1]):
                np.add.at(c[:, layer], (bins, selected[:, k]), 1)
                np.add.at(pc[layer], selected[a:b, k], 1)
        counts.append(c)
        tokens.append(np.bincount(bins, minlength=len(BINS)))
        program_counts.append(pc)
        program_tokens.append(b - a)
        task_ids.append(trace["task_id"])
        if progress:
            progress(number + 1, len(traces))
        if (number + 1 - start) % save_every == 0:
            snapshot().save(out)
    recorder.remove()
    stats = snapshot() if counts else done
    stats.save(out)
    return stats


def main(argv: list[str] | None = None) -> int:
    if argv is None:
        argv = sys.argv[1:]
    if argv[:1] == ["merge"]:
        parser = argparse.ArgumentParser(prog="python -m build.calibrate merge")
        parser.add_argument("inputs", nargs="+", type=Path)
        parser.add_argument("--out", required=True, type=Path)
        args = parser.parse_args(argv[1:])
        merged = RoutingStats.load(args.inputs[0])
        for path in args.inputs[1:]:
            merged = merged.merge(RoutingStats.load(path))
        merged.save(args.out)
        print(f"{merged.counts.shape[0]} traces -> {args.out}")
        return 0
    parser = argparse.ArgumentParser(prog="python -m build.calibrate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--traces", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--save-every", type=int, default=16)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    try:
        stats = calibrate(args.model, read_traces(args.traces), args.out, args.device, args.dtype, args.save_every,
                          progress=lambda i, n: print(f"\rtrace {i}/{n}", end="", file=sys.stderr))
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"\n{stats.counts.shape[0]} traces, {int(stats.tokens.sum())} tokens in "
          f"{time.perf_counter() - started:.1f} s -> {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
