"""LoRA training on four rows drives their loss down by at least half, resumes after an interruption, and the merged
model's logits equal the adapter model's within bf16 rounding. Needs the build environment (peft; make build-env)."""

from __future__ import annotations

import dataclasses
import json

import pytest

pytest.importorskip("peft", reason="training needs peft (make build-env)")
try:  # in the unsloth environment, unsloth must be imported before transformers
    import unsloth  # noqa: F401
    HAVE_UNSLOTH = True
except ImportError:
    HAVE_UNSLOTH = False

import torch  # noqa: E402

from build.models.tiny import make_checkpoint  # noqa: E402
from submission.reasoning.profile import PromptConfig  # noqa: E402
from submission.reasoning.prompt import render  # noqa: E402
from submission.tasks import load_tasks  # noqa: E402
from training.dataset import completion_ids, make_row, write_rows  # noqa: E402
from training.memory import MemoryPlan, chunk_mlps, row_loss  # noqa: E402
from training.rft import TARGETS, TrainConfig, merge, resolve_device, schedule, target_modules, train  # noqa: E402

QWEN3 = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # no linear attention


class Stop(Exception):
    pass


@pytest.fixture(scope="module")
def setup(tmp_path_factory, arc_data):
    from transformers import AutoTokenizer

    from transformers import AutoModelForCausalLM

    root = tmp_path_factory.mktemp("rft")
    raw = make_checkpoint(root / "raw", "qwen3", seed=0)
    # Random weights give near-uniform logits whatever the hidden state (the output head's rows are tiny and the
    # final norm fixes the state's scale), so no adapter could halve the loss: give the head a trained model's scale.
    model = AutoModelForCausalLM.from_pretrained(raw, dtype=torch.bfloat16)
    with torch.no_grad():
        model.lm_head.weight.mul_(30)
    model.save_pretrained(root / "base")
    base = root / "base"
    tokenizer = AutoTokenizer.from_pretrained(raw)
    tokenizer.save_pretrained(base)
    tasks = [t for t in load_tasks(arc_data / "arc-agi-2" / "training").tasks if t.id in
             ("3c9b0459", "6150a2bd", "67a3c6ac", "68b16354")]
    rows = []
    for task in tasks:
        prompt = render(tokenizer, task, 0, PromptConfig())[1]
        answer = "\n" + "\n".join(" ".join(map(str, r)) for r in task.test_outputs[0]) + "\n"
        rows.append(make_row(task.id, 0, prompt, completion_ids(tokenizer, "Rotate or mirror the grid.\n", answer)))
    write_rows(rows, root / "rows.jsonl")
    config = TrainConfig(base=str(base), rows=str(root / "rows.jsonl"), out=str(root / "run"), rank=8, alpha=16,
                         lr=3e-3, epochs=30, grad_accum=4, checkpoint_every=10, warmup=0.05, targets=QWEN3)
    return root, config, rows


def test_schedule_warms_up_then_decays():
    values = [schedule(s, 100, 0.05) for s in range(100)]
    assert values[0] == pytest.approx(0.2) and values[4] == 1.0 and values[-1] < 0.01
    assert all(a >= b for a, b in zip(values[4:], values[5:]))


def test_device_is_the_gpu_when_there_is_one():
    assert resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert resolve_device("cpu") == "cpu"
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no CUDA GPU"):
            resolve_device("cuda:1")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.requires_gpu)])
def test_training_halves_the_loss_and_resumes(setup, device, tmp_path):
    """On the CPU in float32 (its run is the adapter the merge test uses); on a GPU in bfloat16, as real runs train."""
    root, config, _ = setup
    if device == "cuda":
        root = tmp_path
        config = dataclasses.replace(config, out=str(root / "run"), device="cuda", dtype="bfloat16")
        torch.cuda.reset_peak_memory_stats()

    def interrupt(step, total, loss):
        if step == 13:
            raise Stop

    with pytest.raises(Stop):
        train(config, progress=interrupt)
    state = torch.load(root / "run" / "checkpoint" / "state.pt", weights_only=False)
    assert state["step"] == 10
    losses = train(config)  # resumes after step 10
    assert len(losses) == 30 and losses[:10] == state["losses"]
    assert sum(losses[-3:]) / 3 <= 0.5 * sum(losses[:3]) / 3, losses
    assert (root / "run" / "loss.png").read_bytes()[:4] == b"\x89PNG"
    assert json.loads((root / "run" / "data.json").read_text()) == {"rows": 4, "dropped_over_max_length": 0,
                                                                    "max_length": 81_920}
    if device == "cuda":
        assert torch.cuda.max_memory_allocated() > 0  # the model and its activations lived on the GPU


def test_merged_equals_adapter_within_bf16(setup):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    root, config, rows = setup
    if not (root / "run" / "adapter").exists():
        train(config)
    merged_dir = merge(config)
    assert json.loads((merged_dir / "config.json").read_text())["arc_kit_patches"]
    base = AutoModelForCausalLM.from_pretrained(config.base, dtype=torch.float32)
    assert target_modules(base, QWEN3) == list(QWEN3)
    with pytest.raises(ValueError, match="in_proj_qkv, in_proj_z, in_proj_b, in_proj_a, out_proj match no Linear"):
        target_modules(base)  # the study's linear-attention names: refused on a model without it, never skipped
    adapted = PeftModel.from_pretrained(base, root / "run" / "adapter").eval()
    merged = AutoModelForCausalLM.from_pretrained(merged_dir, dtype=torch.float32).eval()
    ids = torch.tensor([rows[0].input_ids[:256]])
    with torch.no_grad():
        a, b = adapted(ids).logits, merged(ids).logits
    scale = a.abs().max()
    assert (a - b).abs().max() <= 2 ** -7 * scale * 4  # bf16 keeps 8 significant bits; a few roundings deep
    assert not torch.equal(a, AutoModelForCausalLM.from_pretrained(config.base, dtype=torch.float32)(ids).logits)
    assert dataclasses.replace(config, recipe="").recipe == ""


def test_merge_requantises_and_recomputes_the_kv_scales_on_the_merged_model(setup, arc_data, tmp_path, read_tensors):
    """The path `make train-rft` ends with when a recipe is set (SPEC 9: merge, patch, re-quantise): the FP8 KV-cache
    scales come from the merged model's own activations on the calibration tasks, not from the base's."""
    import shutil

    from build.quantize.activations import kv_amax
    from build.quantize.kv_scales import calibration_prompts, scales

    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    _, config, _ = setup
    # An adapter that changes every projection it targets (random B, not PEFT's zero start): no training needed
    run = tmp_path / "run"
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=list(QWEN3), init_lora_weights=False)
    torch.manual_seed(0)
    get_peft_model(AutoModelForCausalLM.from_pretrained(config.base, dtype=torch.float32), lora).save_pretrained(
        run / "adapter")
    config = dataclasses.replace(config, out=str(run))
    recipe = "build/recipes/dense-27b-4xL4.toml"
    with pytest.raises(ValueError, match="calibration_tasks"):  # scales are not left stale by omission
        dataclasses.replace(config, recipe=recipe)
    tasks = tmp_path / "tasks"
    tasks.mkdir()
    for name in ("3c9b0459", "6150a2bd"):
        shutil.copy(arc_data / "arc-agi-2" / "training" / f"{name}.json", tasks)
    result = merge(dataclasses.replace(config, recipe=recipe, calibration_tasks=str(tasks)))
    assert result == run / "merged-quantized"
    merged = run / "merged"  # what was quantised: the merge (the base's end-of-turn patch carried over)
    assert not (run / "merged-patched").exists()
    prompts = calibration_prompts(merged, load_tasks(tasks).tasks, 256)
    expected, stale = scales(kv_amax(merged, prompts)), scales(kv_amax(config.base, prompts))
    after = read_tensors(result)
    assert sorted(expected) == sorted(k for k in after if k.endswith(("k_scale", "v_scale"))) and expected
    assert all(after[name].item() == pytest.approx(value, rel=1e-3) for name, value in expected.items())
    assert any(abs(after[name].item() - stale[name]) > 1e-3 * stale[name] for name in expected)  # not the base's
    quantization = json.loads((result / "config.json").read_text())["quantization_config"]
    assert quantization["kv_cache_scheme"]["dynamic"] is False
    unscaled = merge(dataclasses.replace(config, recipe=recipe, kv_scales=False))  # opting out keeps none
    assert not any(k.endswith("k_scale") for k in read_tensors(unscaled))


@pytest.mark.skipif(not HAVE_UNSLOTH, reason="the unsloth backend runs in its own environment (make unsloth-env)")
def test_unsloth_backend_halves_the_loss_too(setup, tmp_path):
    _, config, _ = setup
    losses = train(dataclasses.replace(config, backend="unsloth", out=str(tmp_path / "unsloth"),
                                       gradient_checkpointing=False))
    assert len(losses) == 30 and sum(losses[-3:]) / 3 <= 0.5 * sum(losses[:3]) / 3, losses


def qwen3_5(**widths):
    """A Qwen3.5 text model (the study's hybrid 27B's layout: three linear-attention layers, then a full one)."""
    from transformers import Qwen3_5ForCausalLM, Qwen3_5TextConfig

    return Qwen3_5ForCausalLM(Qwen3_5TextConfig(**widths))


def test_the_study_targets_are_its_496_modules_and_233_5m_parameters():
    """seed ~1966-1971, ~4428-4429: twelve projection types, 496 modules, 233.5M LoRA parameters at rank 32, on the
    27B's layout (64 layers, 16 of them full attention; widths as Qwen3.5-27B's), built on the meta device."""
    with torch.device("meta"):
        model = qwen3_5(hidden_size=5120, intermediate_size=17408, num_hidden_layers=64, num_attention_heads=24,
                        num_key_value_heads=4, head_dim=256, linear_num_key_heads=16, linear_num_value_heads=48)
    names = target_modules(model, TARGETS)
    modules = [m for name, m in model.named_modules()
               if isinstance(m, torch.nn.Linear) and name.rsplit(".", 1)[-1] in names]
    assert len(names) == 12 and len(modules) == 496
    assert sum(32 * (m.in_features + m.out_features) for m in modules) / 1e6 == pytest.approx(233.5, abs=0.05)


def _chunked_equals_plain(model, targets):
    """The LoRA gradients and the loss of one 700-token row through the memory techniques (re-entrant checkpointing,
    offload, MLP slices of 96 positions, loss slices of 128: neither divides 700) against the model's own loss."""
    import copy

    from peft import LoraConfig, get_peft_model

    torch.manual_seed(0)
    lora = LoraConfig(r=8, lora_alpha=16, target_modules=target_modules(model, targets), init_lora_weights=False)
    peft = get_peft_model(model.float(), lora).train()
    ids = torch.randint(0, model.config.vocab_size, (1, 700))
    labels = ids.clone()
    labels[:, :100] = -100  # a masked prompt
    plain = copy.deepcopy(peft)
    expected = plain(input_ids=ids, labels=labels).loss
    expected.backward()
    peft.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    peft.enable_input_require_grads()
    assert chunk_mlps(peft, 96) == model.config.num_hidden_layers
    loss = row_loss(peft, ids, labels, MemoryPlan(reentrant=True, offload=True, pin_memory=False, mlp_chunk=96,
                                                  loss_chunk=128))
    loss.backward()
    # fp32 throughout: the slices change only the order of the sums, so 1e-6 of the loss and 1e-4 of each gradient
    # tensor's largest entry (measured: ~0 and ~7e-6)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    grads = {n: p.grad for n, p in peft.named_parameters() if p.requires_grad}
    reference = {n: p.grad for n, p in plain.named_parameters() if p.requires_grad}
    assert grads.keys() == reference.keys() and all(g.abs().max() > 0 for g in grads.values())
    for name, grad in grads.items():
        assert (grad - reference[name]).abs().max() <= 1e-4 * reference[name].abs().max(), name


def test_chunked_loss_and_gradients_equal_the_plain_ones_on_the_studys_architecture():
    _chunked_equals_plain(qwen3_5(vocab_size=1024, hidden_size=128, intermediate_size=256, num_hidden_layers=4,
                                  num_attention_heads=2, num_key_value_heads=1, head_dim=64, linear_num_key_heads=2,
                                  linear_num_value_heads=4, linear_key_head_dim=32, linear_value_head_dim=32),
                          TARGETS)


def test_chunked_loss_and_gradients_equal_the_plain_ones_on_qwen3_next():
    """Qwen3-Next: fused linear-attention projections (the study's names mapped) and MoE MLPs (chunked too)."""
    from transformers import AutoModelForCausalLM

    from build.models.tiny import make_config

    _chunked_equals_plain(AutoModelForCausalLM.from_config(make_config("qwen3_next", 1024, 1, 2)), TARGETS)


def test_peak_memory_is_linear_in_length_and_holds_no_logits_per_token():
    """training.rft.train's step at 1,024, 2,048 and 4,096 tokens with a 65,536-token vocabulary, its peak measured
    as benchmarks/rft_memory.py says (a fresh process each, peak resident set with every large tensor its own
    mapping). With the study's techniques (slices scaled down with the lengths) the peak grows by ~6 KB per token
    (the activations a hidden width of 256 keeps), linearly: doubling the length doubles the increment (measured
    1.9-2.2). The model's own loss over full logits instead keeps ~3 fp32 logit rows (vocabulary x 4 bytes each,
    ~790 KB) per token."""
    from benchmarks.rft_memory import measure, model_config

    vocab = 65_536
    peaks = measure([1024, 2048, 4096], model_config("qwen3", vocab, 256, 2), {"mlp_chunk": 256, "loss_chunk": 128})
    per_token = (peaks[4096] - peaks[1024]) / 3072
    assert per_token < vocab * 4 / 8, peaks  # less than an eighth of one logits row per token (measured: ~2%)
    first, second = peaks[2048] - peaks[1024], peaks[4096] - peaks[2048]
    assert 1.4 <= second / first <= 2.6, peaks  # linear: 2 (a quadratic term would push it towards 4)


def test_the_gpu_checks_extrapolation_adds_the_other_layers_weights_and_lora_state():
    """benchmarks/rft_memory.extrapolate, which .ci/gpu-checks uses to carry a 4-layer measurement to 64 layers: 60
    more layers of bf16 weights (the 27B's 26.90B parameters less its two 248,320 x 5,120 embeddings, over 64) and of
    LoRA state (233.5M parameters x 16 bytes, over 64)."""
    from benchmarks.rft_memory import extrapolate, model_config

    four = model_config("27b", 248_320, 0, 4)
    assert extrapolate(123, four, 4) == 123
    layers = 26_895_998_464 - 2 * 248_320 * 5_120 - 5_120  # less the embeddings and the final norm
    assert extrapolate(0, four, 64) == pytest.approx(60 / 64 * (2 * layers + 16 * 233_455_616), rel=1e-6)


def test_offload_takes_each_checkpointed_layer_input(monkeypatch):
    """With re-entrant checkpointing what autograd keeps of the forward is each layer's input (64 x 81,920 x 5,120
    bf16 = 50 GiB on the 27B): under the plan's offload every one of them goes through torch's save_on_cpu."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from build.models.tiny import make_config

    saved = []

    class Recording(torch.autograd.graph.save_on_cpu):
        def __init__(self, pin_memory=False):
            super().__init__(pin_memory)
            pack = self.pack_hook
            self.pack_hook = lambda tensor: (saved.append(tuple(tensor.shape)), pack(tensor))[1]

    monkeypatch.setattr(torch.autograd.graph, "save_on_cpu", Recording)
    model = AutoModelForCausalLM.from_config(make_config("qwen3", 1024, 1, 2))
    peft = get_peft_model(model, LoraConfig(r=8, target_modules=["q_proj", "v_proj"])).train()
    peft.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    peft.enable_input_require_grads()
    ids = torch.randint(0, 1024, (1, 300))
    loss = row_loss(peft, ids, ids, MemoryPlan(reentrant=True, offload=True, pin_memory=False, mlp_chunk=0,
                                               loss_chunk=128))
    loss.backward()
    assert saved.count((1, 300, model.config.hidden_size)) >= model.config.num_hidden_layers, saved
