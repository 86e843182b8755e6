"""The likelihood check separates a mild change of the weights from a destructive one (naive INT4 attention).
Needs torch and transformers (the engine or build environment)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the likelihood check needs torch (make build-env)")

from build.check_quality import compare, main  # noqa: E402
from build.models.tiny import make_checkpoint  # noqa: E402


def reference(folder):
    """A tiny Qwen3 with a confident output head (random weights are otherwise near-uniform, and every model would
    predict random tokens equally badly)."""
    from transformers import AutoModelForCausalLM

    source = make_checkpoint(folder / "raw", "qwen3", seed=0)
    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32)
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    model.save_pretrained(folder / "reference")
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / "reference" / name).write_bytes((source / name).read_bytes())
    return folder / "reference", model


def variant(folder, model, name, change):
    import copy

    other = copy.deepcopy(model)
    with torch.no_grad():
        for param_name, param in other.named_parameters():
            change(param_name, param)
    other.save_pretrained(folder / name)
    for file in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (folder / name / file).write_bytes((folder / "reference" / file).read_bytes())
    return folder / name


def naive_int4(name, param):
    if any(p in name for p in ("q_proj", "k_proj", "v_proj", "o_proj")):
        low, high = param.min(), param.max()
        step = (high - low) / 15
        param.copy_(torch.round((param - low) / step) * step + low)


def mild(name, param):
    param.add_(torch.randn(param.shape, generator=torch.Generator().manual_seed(1)) * param.std() * 1e-3)


def own_traces(model, n=4, length=160, prompt=32, seed=0):
    """Completions sampled from the reference itself: what it predicts well."""
    g = torch.Generator().manual_seed(seed)
    traces = []
    for i in range(n):
        ids = torch.randint(10, model.config.vocab_size, (1, prompt), generator=g)
        torch.manual_seed(seed + i)
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=length - prompt, do_sample=True, temperature=1.0, top_k=0,
                                 pad_token_id=0, eos_token_id=None)
        ids = out[0].tolist()
        traces.append({"task_id": f"t{i}", "token_ids": ids, "program": [0, 0],
                       "segments": {"prompt": [0, prompt], "thinking": [prompt, length - 20],
                                    "answer": [length - 20, len(ids)]}})
    return traces


def test_mild_passes_destructive_fails(tmp_path):
    ref_dir, model = reference(tmp_path)
    traces = own_traces(model)
    gentle = variant(tmp_path, model, "mild", mild)
    broken = variant(tmp_path, model, "int4", naive_int4)
    same = compare(ref_dir, ref_dir, traces)
    assert same.difference == 0 and same.passed
    ok = compare(ref_dir, gentle, traces)
    bad = compare(ref_dir, broken, traces)
    assert ok.passed and abs(ok.difference) < 0.02, ok.reason
    assert not bad.passed and bad.difference > 0.1, bad.reason
    assert set(bad.by_bin) == {"think_0_16k", "answer"}


def test_cli_exit_codes(tmp_path):
    import json

    ref_dir, model = reference(tmp_path)
    broken = variant(tmp_path, model, "int4", naive_int4)
    (tmp_path / "traces.jsonl").write_text("".join(json.dumps(t) + "\n" for t in own_traces(model, n=2)))
    assert main(["--reference", str(ref_dir), "--candidate", str(ref_dir), "--traces", str(tmp_path / "traces.jsonl")]) == 0
    assert main(["--reference", str(ref_dir), "--candidate", str(broken), "--traces", str(tmp_path / "traces.jsonl")]) == 1
