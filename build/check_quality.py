"""The likelihood check: does a rebuilt checkpoint (quantised, pruned, patched) still predict what the original does?

    python -m build.check_quality --reference DIR --candidate DIR --traces traces.jsonl [--threshold 0.02]

Teacher-forced negative log-likelihood per token of the traces' completions (everything after the prompt) under both
models, by length bin (build.prune.stats.BINS), and the difference candidate - reference in nats/token: the study's
calibrated FP8 KV cache moved it by < 0.0005, naive INT4 attention broke the model at +0.64 (SPEC section 8). The
verdict passes when the difference is at most `threshold`. Also the mean probability of `</think>` over windows of
the thinking: a candidate that raises it markedly (`think_end_ratio`) will stop thinking early. Traces use the
calibration format (build.prune.calibrate); the best traces are the reference model's own completions. Each model runs
in turn, one decoder layer at a time from its shards (build.layerwise, transformers' modules, CPU or GPU): memory is one
layer plus the hidden states of `--chunk-tokens` tokens, never two models. A quantised candidate is dequantised
module by module in memory as its layers load (compressed-tensors' compressors): no dequantised copy is written.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from build.prune.calibrate import read_traces, token_bins
from build.prune.stats import BINS


@dataclass(frozen=True)
class Quality:
    nll_reference: float  # nats/token over all completion tokens
    nll_candidate: float
    difference: float  # candidate - reference
    by_bin: dict[str, tuple[float, float, int]]  # bin -> (reference, candidate, tokens)
    think_end_reference: float  # mean p(</think>) over thinking windows
    think_end_candidate: float
    passed: bool
    reason: str


def token_scores(hidden, head, ids: list[int], think_end: int, rows: int = 1024) -> tuple[np.ndarray, np.ndarray]:
    """From final hidden states [tokens, hidden] and the output head's weight: the NLL of every token given its
    prefix (index 0: nan) and p(`</think>`) as the next token at every position. Logits are made `rows` positions at a
    time (a 150k vocabulary x 30k positions would be 18 GB at once)."""
    import torch

    target = torch.tensor(ids[1:] + [0], device=hidden.device)
    nll, end = [], []
    with torch.no_grad():
        for start in range(0, hidden.shape[0], rows):
            logp = torch.log_softmax(torch.nn.functional.linear(hidden[start:start + rows], head).float(), dim=-1)
            nll.append(-logp.gather(1, target[start:start + rows, None])[:, 0])
            end.append(logp[:, think_end].exp())
    nll = torch.cat(nll).cpu().numpy()
    return np.concatenate([[np.nan], nll[:-1]]), torch.cat(end).cpu().numpy()


def window_means(values: np.ndarray, window: int) -> list[float]:
    return [float(values[i:i + window].mean()) for i in range(0, len(values), window)]


def score(model: str | Path, traces: list[dict], think_end: int, window: int = 256, device: str = "cpu",
          chunk_tokens: int = 65536, on_step=None) -> tuple[list[np.ndarray], list[list[float]]]:
    """Per trace, the NLL of each token and the mean p(`</think>`) per window of its thinking, run layer by layer
    (build.layerwise): one decoder layer resident, a quantised checkpoint dequantised as each layer loads."""
    from build.layerwise import LayerRunner

    runner = LayerRunner(model, device, "float32", head=True)
    nlls: list[np.ndarray] = [np.empty(0)] * len(traces)
    ends: list[list[float]] = [[] for _ in traces]
    for group, hidden in runner.run([t["token_ids"] for t in traces], chunk_tokens, progress=on_step):
        for index, h in zip(group, hidden):
            trace = traces[index]
            nlls[index], end = token_scores(h, runner.head.weight, trace["token_ids"], think_end)
            t0, t1 = trace["segments"]["thinking"]
            ends[index] = window_means(end[t0:t1], window) if t1 > t0 else []
    return nlls, ends


def compare(reference: str | Path, candidate: str | Path, traces: list[dict], threshold: float = 0.02,
            think_end_ratio: float = 2.0, window: int = 256, device: str = "cpu", chunk_tokens: int = 65536,
            on_step=None) -> Quality:
    """Score the traces under each model in turn (never both in memory) and compare."""
    from transformers import AutoTokenizer

    think_end = AutoTokenizer.from_pretrained(reference).convert_tokens_to_ids("</think>")
    sums = {name: {"ref": 0.0, "cand": 0.0, "n": 0} for name in BINS}
    ends = {"ref": [], "cand": []}
    for role, path in (("ref", reference), ("cand", candidate)):
        nlls, think = score(path, traces, think_end, window, device, chunk_tokens, on_step)
        for trace, nll, windows in zip(traces, nlls, think):
            bins = token_bins(trace)
            for index in range(max(trace["segments"]["prompt"][1], 1), len(trace["token_ids"])):
                entry = sums[BINS[bins[index]]]
                entry[role] += float(nll[index])
                entry["n"] += role == "ref"
            ends[role] += windows
    tokens = sum(v["n"] for v in sums.values())
    if tokens == 0:
        raise ValueError("the traces have no completion tokens to score")
    ref = sum(v["ref"] for v in sums.values()) / tokens
    cand = sum(v["cand"] for v in sums.values()) / tokens
    by_bin = {name: (v["ref"] / v["n"], v["cand"] / v["n"], v["n"]) for name, v in sums.items() if v["n"]}
    end_ref = float(np.mean(ends["ref"])) if ends["ref"] else 0.0
    end_cand = float(np.mean(ends["cand"])) if ends["cand"] else 0.0
    ok_nll = cand - ref <= threshold
    ok_end = end_cand <= think_end_ratio * max(end_ref, 1e-12)
    reason = (f"NLL {cand - ref:+.4f} nats/token {'<=' if ok_nll else '>'} {threshold}; p(</think>) "
              f"{end_cand:.2e} against {end_ref:.2e} {'(ok)' if ok_end else f'(over x{think_end_ratio})'}")
    return Quality(ref, cand, cand - ref, by_bin, end_ref, end_cand, ok_nll and ok_end, reason)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m build.check_quality", description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference", required=True, type=Path)
    parser.add_argument("--candidate", required=True, type=Path)
    parser.add_argument("--traces", required=True, type=Path)
    parser.add_argument("--threshold", type=float, help="largest NLL increase allowed, nats/token (default: the "
                                                         "recipe's check.max_nll_increase, else 0.02)")
    parser.add_argument("--recipe", type=Path, help="the quantisation recipe the candidate was made with")
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--chunk-tokens", type=int, default=65536,
                        help="tokens of traces whose hidden states are kept between layers")
    args = parser.parse_args(argv)
    threshold = args.threshold
    if threshold is None:
        from build.quantize.quantizer import load_recipe

        threshold = load_recipe(args.recipe).check.max_nll_increase if args.recipe else 0.02
    try:
        quality = compare(args.reference, args.candidate, read_traces(args.traces), threshold, device=args.device,
                          chunk_tokens=args.chunk_tokens)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(asdict(quality), indent=1))
    else:
        for name, (ref, cand, n) in quality.by_bin.items():
            print(f"{name:14s} {n:8d} tokens  reference {ref:.4f}  candidate {cand:.4f}  {cand - ref:+.4f}")
        print(f"verdict: {'PASS' if quality.passed else 'FAIL'}: {quality.reason}")
    return 0 if quality.passed else 1


if __name__ == "__main__":
    sys.exit(main())
