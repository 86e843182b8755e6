"""The likelihood check: does a rebuilt checkpoint (quantised, pruned, patched) still predict what the original does?

    python -m build.check_quality --reference DIR --candidate DIR --traces traces.jsonl [--threshold 0.02]

Teacher-forced negative log-likelihood per token of the traces' completions (everything after the prompt) under both
models, by length bin (build.stats.BINS), and the difference candidate - reference in nats/token: the study's
calibrated FP8 KV cache moved it by < 0.0005, naive INT4 attention broke the model at +0.64 (SPEC section 8). The
verdict passes when the difference is at most `threshold`. Also the mean probability of `</think>` over windows of
the thinking: a candidate that raises it markedly (`think_end_ratio`) will stop thinking early. Traces use the
calibration format (build.calibrate); the best traces are the reference model's own completions. Both models load
with transformers on the CPU (or a GPU): quantised checkpoints are decompressed where no kernel exists.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from build.calibrate import read_traces, token_bins
from build.stats import BINS


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


def token_nll(model, ids: list[int], device: str = "cpu") -> np.ndarray:
    """NLL of every token given its prefix (the first token gets none: index 0 is nan)."""
    import torch

    with torch.no_grad():
        logits = model(torch.tensor([ids], device=device)).logits[0].float()
    logp = torch.log_softmax(logits[:-1], dim=-1)
    nll = -logp.gather(1, torch.tensor(ids[1:], device=device)[:, None])[:, 0]
    return np.concatenate([[np.nan], nll.cpu().numpy()])


def think_end_probability(model, ids: list[int], think_end: int, start: int, end: int, window: int,
                          device: str = "cpu") -> list[float]:
    """Mean probability of `</think>` as the next token, per window of the thinking segment."""
    import torch

    with torch.no_grad():
        probs = torch.softmax(model(torch.tensor([ids], device=device)).logits[0].float(), dim=-1)[:, think_end]
    values = probs[start:end].cpu().numpy()
    return [float(values[i:i + window].mean()) for i in range(0, len(values), window) if len(values[i:i + window])]


def compare(reference: str | Path, candidate: str | Path, traces: list[dict], threshold: float = 0.02,
            think_end_ratio: float = 2.0, window: int = 256, device: str = "cpu") -> Quality:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    think_end = AutoTokenizer.from_pretrained(reference).convert_tokens_to_ids("</think>")
    if "quantization_config" in json.loads((Path(candidate) / "config.json").read_text()):
        import tempfile

        from build.quantize import dequantize_checkpoint

        candidate = dequantize_checkpoint(candidate, Path(tempfile.mkdtemp(prefix="dequantised-")) / "model")
    sums = {name: {"ref": 0.0, "cand": 0.0, "n": 0} for name in BINS}
    ends = {"ref": [], "cand": []}
    for role, path in (("ref", reference), ("cand", candidate)):
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).to(device).eval()
        for trace in traces:
            ids = trace["token_ids"]
            start = trace["segments"]["prompt"][1]
            nll = token_nll(model, ids, device)
            bins = token_bins(trace)
            for index in range(max(start, 1), len(ids)):
                entry = sums[BINS[bins[index]]]
                entry[role] += float(nll[index])
                entry["n"] += role == "ref"
            t0, t1 = trace["segments"]["thinking"]
            if t1 > t0:
                ends[role] += think_end_probability(model, ids, think_end, t0, t1, window, device)
        del model
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
    args = parser.parse_args(argv)
    threshold = args.threshold
    if threshold is None:
        from build.quantize import load_recipe

        threshold = load_recipe(args.recipe).max_nll_increase if args.recipe else 0.02
    try:
        quality = compare(args.reference, args.candidate, read_traces(args.traces), threshold, device=args.device)
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
