"""Routing statistics recorded with hooks on a tiny Qwen3-MoE: counts, bins, program tokens, REAP saliency against the
model's own expert outputs, resume and merge. Needs torch (the engine or build environment)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="calibration needs torch (make build-env)")

from build.models.tiny import make_config, make_tokenizer  # noqa: E402
from build.prune.calibrate import calibrate, main, read_traces, token_bins  # noqa: E402
from build.prune.stats import BINS, RoutingStats  # noqa: E402


def tiny_moe(folder, top_k: int = 2):
    from transformers import AutoModelForCausalLM

    tokenizer = make_tokenizer(folder)
    config = make_config("qwen3_moe", len(tokenizer), tokenizer.eos_token_id, tokenizer.pad_token_id)
    config.num_experts_per_tok = top_k
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).save_pretrained(folder)
    return folder


def traces(n: int, vocab: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p, t, a = rng.randint(5, 20), rng.randint(5, 40), rng.randint(5, 20)
        ids = [rng.randrange(vocab) for _ in range(p + t + a)]
        out.append({"task_id": f"task{i // 2}", "token_ids": ids,
                    "segments": {"prompt": [0, p], "thinking": [p, p + t], "answer": [p + t, p + t + a]},
                    "program": [p + t + 2, p + t + a]})
    return out


def test_counts_bins_and_program_tokens(tmp_path):
    model = tiny_moe(tmp_path / "m")
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    stats = calibrate(model, traces(6, vocab), tmp_path / "stats.npz")
    assert stats.counts.shape == (6, len(BINS), 2, 8) and stats.top_k == 2
    assert np.array_equal(stats.counts.sum(axis=(2, 3)), stats.tokens * 2 * 2)  # tokens x top_k x layers
    assert np.array_equal(stats.program_counts.sum(axis=(1, 2)), stats.program_tokens * 2 * 2)
    assert stats.tokens[:, 0].tolist() == [t["segments"]["prompt"][1] for t in traces(6, vocab)]
    assert stats.task_ids == ["task0", "task0", "task1", "task1", "task2", "task2"]
    assert np.array_equal(stats.saliency_n, stats.counts.sum(axis=(0, 1)))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.requires_gpu)])
def test_saliency_is_gate_times_expert_output_norm(tmp_path, device):
    """With one expert per token the MoE block's output is gate x expert output (gate 1 after normalisation),
    so each expert's saliency sum is the summed norm of the block outputs of its tokens (reference: on the CPU)."""
    model_dir = tiny_moe(tmp_path / "m", top_k=1)
    from transformers import AutoModelForCausalLM

    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    data = traces(3, vocab, seed=4)
    stats = calibrate(model_dir, data, tmp_path / "stats.npz", device=device)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    expected = np.zeros((2, 8))
    blocks = [m for _, m in model.named_modules() if hasattr(m, "gate") and hasattr(m, "experts")]
    captured = {}
    for layer, block in enumerate(blocks):
        block.gate.register_forward_hook(lambda m, a, out, layer=layer: captured.__setitem__(("idx", layer), out[2]))
        block.experts.register_forward_hook(lambda m, a, out, layer=layer: captured.__setitem__(("out", layer), out))
    for trace in data:
        with torch.no_grad():
            model(torch.tensor([trace["token_ids"]]))
        for layer in range(2):
            norms = captured[("out", layer)].norm(dim=-1).numpy()
            np.add.at(expected[layer], captured[("idx", layer)][:, 0].numpy(), norms)
    assert np.allclose(stats.saliency_sum, expected, rtol=1e-4, atol=1e-6)


def test_resume_and_merge(tmp_path):
    model = tiny_moe(tmp_path / "m")
    vocab = json.loads((model / "config.json").read_text())["vocab_size"]
    data = traces(5, vocab)
    whole = calibrate(model, data, tmp_path / "whole.npz")
    calibrate(model, data[:3], tmp_path / "resumed.npz", save_every=1)
    resumed = calibrate(model, data, tmp_path / "resumed.npz")  # continues after the 3 traces already there
    assert np.array_equal(resumed.counts, whole.counts) and resumed.task_ids == whole.task_ids
    assert np.allclose(resumed.saliency_sum, whole.saliency_sum, rtol=1e-6)
    calibrate(model, data[:2], tmp_path / "a.npz")
    (tmp_path / "rest.jsonl").write_text("".join(json.dumps(t) + "\n" for t in data[2:]))
    calibrate(model, read_traces(tmp_path / "rest.jsonl"), tmp_path / "b.npz")
    assert main(["merge", str(tmp_path / "a.npz"), str(tmp_path / "b.npz"), "--out", str(tmp_path / "ab.npz")]) == 0
    merged = RoutingStats.load(tmp_path / "ab.npz")
    assert np.array_equal(merged.counts, whole.counts)


def test_token_bins_and_bad_traces(tmp_path):
    trace = {"token_ids": list(range(40_000)), "segments": {"prompt": [0, 100], "thinking": [100, 39_000],
                                                           "answer": [39_000, 40_000]}}
    bins = token_bins(trace)
    assert bins[0] == 0 and bins[100] == 1 and bins[100 + 16_384] == 2 and bins[39_500] == len(BINS) - 1
    (tmp_path / "bad.jsonl").write_text(json.dumps({"task_id": "x", "token_ids": [1, 2], "segments": {
        "prompt": [0, 1], "thinking": [1, 5], "answer": [2, 2]}}) + "\n")
    with pytest.raises(ValueError, match=r"bad.jsonl:1: bad trace: segment thinking"):
        read_traces(tmp_path / "bad.jsonl")


def test_traces_use_the_solvers_prompt(tmp_path, arc_data):
    from transformers import AutoTokenizer

    from training.calibration_traces import make_traces
    from submission.reasoning.profile import PromptConfig
    from submission.reasoning.prompt import render
    from submission.tasks import load_tasks

    model = tiny_moe(tmp_path / "m")
    tasks = load_tasks(arc_data / "arc-agi-2" / "training" / "3c9b0459.json").tasks
    trace = make_traces(model, tasks, thinking=16)[0]
    tokenizer = AutoTokenizer.from_pretrained(model)
    p, t = trace["segments"]["thinking"]
    assert trace["token_ids"][:p] == render(tokenizer, tasks[0], 0, PromptConfig())[1]
    assert t - p == 16 and trace["segments"]["answer"] == [t, len(trace["token_ids"])]
    a, b = trace["program"]
    assert "np.rot90" in tokenizer.decode(trace["token_ids"][a:b])  # the example program of this task
    assert (tmp_path / "m" / "config.json").exists()
