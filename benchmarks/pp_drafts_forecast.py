"""Forecast of issue 43's choices for MTP drafts under pipeline parallelism on vLLM 0.33 (`python -m sim forecast`
per choice, same seeds), printed against the shipped layout in the same run:

    python benchmarks/pp_drafts_forecast.py [--runs 50] [--accepted 1.5]     (the core environment; ~20 s)

The serving model of moe-4xL4 (sim/serving_models/moe-4xL4.toml) states SPEC's 8 tokens/s per stream, a rate
measured with drafts accepted; a step there gives 1 + A tokens a request, A the accepted drafts per step that rate
holds (`--accepted`; the issue reads the study's rate as ~2-3 tokens a step: A = 1.5, and 1 and 2 are printed too).
Approximate, as the serving model is: nothing here was measured on L4s.

- kept drafts (shipped): TP2 x PP2 with the kit's scheduler keeping each request's drafts
  (submission.reasoning.engines.vllm_scheduler; tests/test_pp_drafts.py shows every draft of the perfect drafter
  accepted): the serving model as it is.
- stock 0.33: the same layout on vLLM's own scheduler: no draft accepted (tests/test_pp_drafts.py), each step still
  computes the 4 drafts: the throughput / (1 + A), the cache unchanged.
- no drafts: the same layout with mtp_speculative_tokens = 0: one token a step, a step without the drafter and with
  1 query token a request instead of 5: throughput / (1 + A) x STEP_SAVING (an assumption: the MTP layer is one
  of 49 mixture-of-experts layers, run 4 times a step, ~8% of the weights read; plus the verification rows).
- TP4, no PP: drafts accepted (no deferral across halves), the throughput of the serving model (not measured:
  its all-reduces cross PCIe twice a layer for 48 layers, TP2 x PP2's for 24; an optimistic assumption), and the
  cache vLLM 0.33 makes of that layout (sim.vllm_cache: the 2 KV heads replicated over 4 GPUs, half the tokens a
  block's bytes hold).
The no-drafts and TP4 caches are derived by sim.vllm_cache as the shipped file's is (its test:
tests/test_sim_cache.py), the state blocks included (3 a request without drafts, 15 with 4).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STEP_SAVING = 1.15  # a drafts-free step's speed against a 4-draft step's (assumed, see above)
LAYERS = "llla" * 12  # Qwen3-Next's 48 layers: every fourth full attention; the drafter's attention layer rides last


def derived_serving(text: str, tp: int, drafts: int) -> Path:
    """The shipped serving file with the cache vLLM 0.33 makes of moe-4xL4's memory at this layout (TP2 runs the
    profile's stages of 25 and 23 layers, TP4 one stage): kv_tokens, block_size and state_blocks replaced."""
    from sim.serving import load_serving
    from sim.vllm_cache import gdn_state_bytes, hybrid_cache

    stages = [LAYERS[:25], LAYERS[25:]] if tp == 2 else [LAYERS]
    stages[-1] += "a" if drafts else ""
    cache = hybrid_cache(stages, 8_267_812_044, max(1, 2 // tp) * 2 * 256,
                         gdn_state_bytes(tp, 16, 32, 128, 128, 4, drafts), drafts, 114_688)
    shipped = load_serving(ROOT / "sim/serving_models/moe-4xL4.toml")
    path = Path(tempfile.mkdtemp()) / f"moe-4xL4-tp{tp}-d{drafts}.toml"
    path.write_text(text.replace(f"kv_tokens = {shipped.kv_tokens}", f"kv_tokens = {cache.kv_tokens}")
                    .replace(f"block_size = {shipped.block_size}", f"block_size = {cache.block_size}")
                    .replace(f"state_blocks = {shipped.state_blocks}", f"state_blocks = {cache.state_blocks}"))
    return path


def forecast(runs: int, throughput: float | None = None, serving: Path | None = None) -> dict:
    data = os.environ.get("ARC_DATA", str(ROOT.parent / "shared" / "arc-data"))
    with tempfile.TemporaryDirectory() as folder:
        command = [sys.executable, "-m", "sim", "forecast", "--log", str(ROOT / "sim/data/example_attempts.jsonl"),
                   "--tasks", f"{data}/arc-agi-2/evaluation", "--profile", "moe-4xL4", "--hidden-tasks", "240",
                   "--runs", str(runs), "--out", folder, "--json", f"{folder}/f.json", "--workers", "1"]
        if throughput is not None:
            command += ["--throughput", f"{throughput:.1f}", "--throughput-running", "64"]
        if serving is not None:
            command += ["--serving", str(serving)]
        subprocess.run(command, cwd=ROOT, check=True, capture_output=True)
        return json.loads(Path(f"{folder}/f.json").read_text())["forecast"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=50)
    parser.add_argument("--accepted", type=float, default=1.5, help="accepted drafts a step the serving rate holds")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from sim.serving import load_serving

    base_model = load_serving(ROOT / "sim/serving_models/moe-4xL4.toml")
    t0 = base_model.throughput(64, 30_000)
    text = (ROOT / "sim/serving_models/moe-4xL4.toml").read_text()
    tp4, no_drafts = derived_serving(text, 4, 4), derived_serving(text, 2, 0)
    rows = [("kept drafts (shipped)", forecast(args.runs))]
    for accepted in sorted({1.0, args.accepted, 2.0}):
        rows.append((f"stock 0.33, A={accepted:g}", forecast(args.runs, t0 / (1 + accepted))))
        rows.append((f"no drafts, A={accepted:g}", forecast(args.runs, t0 * STEP_SAVING / (1 + accepted),
                                                                   serving=no_drafts)))
    rows.append(("TP4 no PP, drafts kept", forecast(args.runs, serving=tp4)))
    base = rows[0][1]
    print(f"moe-4xL4 forecasts, {args.runs} runs each (same seeds); throughput at 64 x 30K: {t0:.0f} tok/s shipped")
    print(f"{'choice':28s} {'score':>7s} {'vs shipped':>10s} {'unanswered':>10s} {'2nd attempts':>12s} "
          f"{'preempt':>8s}")
    for name, f in rows:
        print(f"{name:28s} {f['score']:7.2f} {f['score'] / base['score']:10.3f} {f['unanswered']:10.1f} "
              f"{f['attempts_by_level'].get('SECOND', 0.0):12.1f} {f['preemptions']:8.1f}")


if __name__ == "__main__":
    main()
