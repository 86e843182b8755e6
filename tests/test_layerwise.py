"""Layer-by-layer execution from the shards (build.layerwise) against the whole model in transformers: the same
logits, the same routing statistics and REAP saliency as whole-model hooks, quantised modules dequantised in memory
exactly as compressed-tensors' dequantiser writes them. Needs the build environment (make build-env)."""

from __future__ import annotations

import json
import random

import numpy as np
import pytest

pytest.importorskip("compressed_tensors.entrypoints.convert.converters.magnitude_expert_pruner",
                    reason="needs the build environment (make build-env)")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM  # noqa: E402

from build.layerwise import LayerRunner, Shards, chunks  # noqa: E402
from build.models.tiny import make_checkpoint  # noqa: E402
from build.prune.calibrate import Recorder, calibrate, count_decisions  # noqa: E402
from build.prune.stats import BINS  # noqa: E402


@pytest.fixture(scope="module", params=["qwen3", "qwen3_moe", "qwen3_next"])
def checkpoint(request, tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp(request.param) / "model", request.param, seed=0,
                           max_shard_size="300KB")


def traces(n: int, vocab: int, seed: int = 0) -> list[dict]:
    rng = random.Random(seed)
    out = []
    for i in range(n):
        p, t, a = rng.randint(5, 20), rng.randint(5, 40), rng.randint(5, 20)
        out.append({"task_id": f"task{i // 2}", "token_ids": [rng.randrange(vocab) for _ in range(p + t + a)],
                    "segments": {"prompt": [0, p], "thinking": [p, p + t], "answer": [p + t, p + t + a]},
                    "program": [p + t + 2, p + t + a]})
    return out


def test_chunks_bound_the_tokens():
    assert chunks([5, 5, 5, 20, 1], 10) == [[0, 1], [2], [3], [4]]
    assert chunks([], 10) == []


def test_final_hidden_states_give_the_whole_models_logits(checkpoint):
    vocab = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
    ids = [t["token_ids"] for t in traces(3, vocab)]
    runner = LayerRunner(checkpoint, head=True)
    steps = []
    got = {}
    for group, hidden in runner.run(ids, chunk_tokens=60, progress=steps.append):
        for index, h in zip(group, hidden):
            got[index] = torch.nn.functional.linear(h, runner.head.weight)
    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    with torch.no_grad():
        for index, sequence in enumerate(ids):
            expected = model(torch.tensor([sequence])).logits[0]
            assert torch.allclose(got[index], expected, atol=1e-5, rtol=1e-4), index
    layers = model.config.num_hidden_layers
    assert len({s.chunk for s in steps}) > 1 and len(steps) == layers * len({s.chunk for s in steps})
    assert all(p.device.type == "meta" for layer in runner.layers for p in layer.parameters())  # dropped after use


@pytest.mark.parametrize("arch", ["qwen3_moe", "qwen3_next"])
def test_layered_statistics_equal_whole_model_hooks(tmp_path, arch):
    source = make_checkpoint(tmp_path / "model", arch, seed=1, max_shard_size="300KB")
    vocab = json.loads((source / "config.json").read_text())["vocab_size"]
    data = traces(5, vocab, seed=2)
    stats = calibrate(source, data, tmp_path / "stats.npz", chunk_tokens=80)

    model = AutoModelForCausalLM.from_pretrained(source, dtype=torch.float32).eval()
    recorder = Recorder(model)
    layers, experts = len(recorder.blocks), recorder.experts
    counts = np.zeros((len(data), len(BINS), layers, experts))
    program = np.zeros((len(data), layers, experts))
    with torch.no_grad():
        for n, trace in enumerate(data):
            model(torch.tensor([trace["token_ids"]]))
            for layer, selected in enumerate(recorder.selected()):
                count_decisions(trace, selected, counts[n][:, layer], program[n][layer])
    assert np.array_equal(stats.counts, counts) and np.array_equal(stats.program_counts, program)
    assert np.array_equal(stats.saliency_n, recorder.saliency_n)
    assert np.allclose(stats.saliency_sum, recorder.saliency_sum, rtol=1e-5, atol=1e-7)
    assert stats.saliency_sum.sum() > 0


@pytest.mark.parametrize("recipe, widths", [
    ("build/recipes/moe-4xL4-nvfp4.toml", None),  # NVFP4 experts, FP8 attention
    ("build/recipes/moe-4xL4.toml", {"moe_intermediate_size": 128}),  # the study's W4A16 (groups of 128)
])
def test_quantised_modules_dequantise_in_memory_as_the_library_does(tmp_path, read_tensors, recipe, widths):
    from build.quantize.quantizer import dequantize_checkpoint, quantize

    source = make_checkpoint(tmp_path / "model", "qwen3_moe", seed=0, max_shard_size="300KB", widths=widths)
    quantize(source, recipe, tmp_path / "q", report=False)
    plain = read_tensors(dequantize_checkpoint(tmp_path / "q", tmp_path / "deq"))
    layer = Shards(tmp_path / "q").read("model.layers.1.", torch.bfloat16)
    expected = {k[len("model.layers.1."):]: v for k, v in plain.items() if k.startswith("model.layers.1.")}
    assert sorted(layer) == sorted(expected)
    for name, tensor in expected.items():
        assert torch.equal(layer[name], tensor), name
    assert not torch.equal(layer["mlp.experts.0.up_proj.weight"],
                           read_tensors(source)["model.layers.1.mlp.experts.0.up_proj.weight"])  # it was quantised
    stacked = Shards(tmp_path / "q").load("model.layers.1.", torch.bfloat16)  # what the layer is given
    experts = stacked["mlp.experts.gate_up_proj"].shape[0]
    assert experts > 1 and stacked["mlp.experts.down_proj"].shape[0] == experts
    for e in range(experts):
        assert torch.equal(stacked["mlp.experts.gate_up_proj"][e], torch.cat(
            [layer[f"mlp.experts.{e}.gate_proj.weight"], layer[f"mlp.experts.{e}.up_proj.weight"]]))
        assert torch.equal(stacked["mlp.experts.down_proj"][e], layer[f"mlp.experts.{e}.down_proj.weight"])


def test_layered_scale_calibration_equals_whole_model_hooks(checkpoint):
    """The static input amax and the KV amax observed one layer at a time (in chunks of prompts) equal the same hooks
    on the whole model in transformers: every module, every value."""
    from build.quantize.activations import activation_amax
    from build.quantize.input_scales import observe_inputs
    from build.quantize.kv_scales import observe_kv

    vocab = json.loads((checkpoint / "config.json").read_text())["vocab_size"]
    prompts = [t["token_ids"] for t in traces(4, vocab, seed=5)]
    steps = []
    got = activation_amax(checkpoint, prompts, chunk_tokens=70, on_step=steps.append)
    assert len({s.chunk for s in steps}) > 1  # several chunks of prompts

    model = AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()
    inputs, kv = {}, {}
    handles = observe_inputs(model, "", inputs) + observe_kv(model, "", kv)
    with torch.no_grad():
        for ids in prompts:
            model(torch.tensor([ids]))
    for handle in handles:
        handle.remove()
    assert sorted(got.inputs) == sorted(inputs) and sorted(got.kv) == sorted(kv)
    assert kv and "lm_head" in inputs and all(v > 0 for v in inputs.values())
    for name, value in inputs.items():
        assert got.inputs[name] == pytest.approx(value, rel=1e-5), name
    for name, (k, v) in kv.items():
        assert got.kv[name] == pytest.approx((k, v), rel=1e-5), name
    if model.config.model_type != "qwen3":  # a MoE: routed experts are observed under their checkpoint names
        assert any(".mlp.experts.0.down_proj" in name for name in got.inputs)
    only_kv = activation_amax(checkpoint, prompts, inputs=False)
    assert only_kv.inputs == {} and only_kv.kv == got.kv  # the same forward, without the input hooks


# Loads layer 0 of a checkpoint in a fresh process and reports the resident set's growth while it loads (the peak is
# reset just before through /proc/self/clear_refs, so the imports' own peak does not hide it) against the bytes of
# the float32 tensors it returns.
PEAK = """import json, sys, torch
from build.layerwise import Shards
shards = Shards(sys.argv[1])
def status(key):
    return next(int(line.split()[1]) * 1024 for line in open("/proc/self/status") if line.startswith(key + ":"))
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
before = status("VmRSS")
state = shards.load("model.layers.0.", torch.float32)
print(json.dumps({"growth": status("VmHWM") - before, "layer": sum(t.nbytes for t in state.values())}))
"""


def test_loading_a_layer_holds_about_its_float32_bytes(tmp_path):
    """A layer of the full 80B topology (512 experts x 3 projections, 4x the tiny widths: ~50 MB in float32, stored
    in bfloat16 across shards) loads with its converted bytes alive and little more: the stored tensors and the
    stacked experts are not held beside the converted ones (they were: 2.3x one layer, benchmarks/RESULTS.md)."""
    import subprocess
    import sys
    from pathlib import Path

    from build.models.topology import write_topology

    if not Path("/proc/self/clear_refs").exists():
        pytest.skip("needs Linux's /proc/self/clear_refs to reset the peak resident set")
    folder = write_topology(tmp_path / "model", "qwen3-next-80b", seed=0, layers=1, width=4)
    result = subprocess.run([sys.executable, "-c", PEAK, str(folder)], capture_output=True, text=True, check=True,
                            cwd=Path(__file__).resolve().parents[1], env={**__import__("os").environ,
                                                                          "OMP_NUM_THREADS": "1"})
    measured = json.loads(result.stdout.splitlines()[-1])
    assert measured["layer"] > 40e6  # the layer dominates what the process allocates while it loads
    assert measured["growth"] < 1.5 * measured["layer"], measured
