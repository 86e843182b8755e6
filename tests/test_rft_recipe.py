"""The RFT v1 recipe's pure parts (SPEC 9): grid-only targets, the token-mean weights, the length limit, no weight
decay, and the KV-scale rule for re-quantisation. Core environment; the training loop itself is tests/test_rft.py."""

from __future__ import annotations

import pytest

from submission.strict_toml import TomlError
from training.dataset import IGNORE, Row, grid_part, grid_target
from training.memory import memory_plan, spans
from training.rft import (TARGETS, TrainConfig, load_config, main, resolve_dtype, resolve_targets, token_weights,
                          within_length)

CUE = ("\n\nThe transformation as a self-contained Python function:\n```python\ndef transform(grid):\n"
       "    return grid\n```")


def test_the_grid_part_stops_before_the_cue_and_program():
    assert grid_part("\n1 2\n3 4\n" + CUE) == "\n1 2\n3 4\n"
    assert grid_part("7\n") == "7\n"
    assert grid_part("no grid here" + CUE) is None


def test_grid_target_keeps_the_sampled_thinking_and_ends_the_turn():
    think_end, eos = 99, 100
    sampled = [5, 6, 7, think_end, 11, 12, 13, 14, 15]  # thinking, </think>, then grid + cue + program as sampled
    encode = lambda text: [ord(c) for c in text]  # noqa: E731 - a stand-in tokenizer: one id per character
    ids = grid_target(sampled, "\n1 2\n" + CUE, think_end, encode, eos)
    assert ids == [5, 6, 7, think_end] + [ord(c) for c in "\n1 2\n"] + [eos]
    with pytest.raises(ValueError, match="without </think>"):
        grid_target([5, 6], "\n1\n", think_end, encode, eos)
    with pytest.raises(ValueError, match="without a grid"):
        grid_target(sampled, "nothing", think_end, encode, eos)


def row(prompt: int, supervised: int) -> Row:
    return Row("t", 0, [1] * (prompt + supervised), [IGNORE] * prompt + [2] * supervised)


def test_token_weights_make_the_step_loss_a_token_mean():
    # one long and one short trace: per-row means weighted by their supervised tokens, not 1/2 each as a mean over
    # rows would; a prompt-less row's first token is never a target (nothing predicts it)
    weights = token_weights([row(10, 300), row(10, 100)])
    assert weights == pytest.approx([0.75, 0.25])
    means = [2.0, 6.0]  # the rows' mean token losses
    assert sum(w * m for w, m in zip(weights, means)) == pytest.approx((300 * 2.0 + 100 * 6.0) / 400)
    assert token_weights([row(0, 5), row(0, 3)]) == pytest.approx([4 / 6, 2 / 6])
    with pytest.raises(ValueError, match="no supervised tokens"):
        token_weights([row(5, 0)])


def test_rows_over_the_limit_are_dropped_and_counted():
    rows = [row(10, 81_910), row(10, 81_911), row(5, 5)]
    kept, dropped = within_length(rows, TrainConfig("b", "r", "o").max_length)
    assert kept == [rows[0], rows[2]] and dropped == 1


def test_defaults_are_the_study_recipe(tmp_path):
    config = TrainConfig("b", "r", "o")
    assert (config.max_length, config.weight_decay, config.kv_scales) == (81_920, 0.0, True)
    assert len(config.targets) == 12 and "in_proj_qkv" in config.targets and "q_proj" in config.targets
    assert (config.mlp_chunk, config.loss_chunk, config.offload_activations, config.dtype) == (8192, 2048, True, "auto")
    with pytest.raises(ValueError, match="calibration_tasks"):
        TrainConfig("b", "r", "o", recipe="build/recipes/dense-27b-4xL4.toml")
    assert TrainConfig("b", "r", "o", recipe="x.toml", kv_scales=False).recipe == "x.toml"
    path = tmp_path / "rft.toml"
    path.write_text('base = "b"\nrows = "r"\nout = "o"\ntargets = ["q_proj", "v_proj"]\n')
    assert load_config(path).targets == ("q_proj", "v_proj")
    path.write_text('base = "b"\nrows = "r"\nout = "o"\nrecipe = "x.toml"\n')
    with pytest.raises(ValueError, match="rft.toml: recipe: .*calibration_tasks"):
        load_config(path)


def test_the_shipped_config_is_the_study_recipe():
    """training/rft.toml (seed ~1966-1971, ~4428-4438): what loading it yields, every value spelled out."""
    config = load_config("training/rft.toml")
    assert (config.rank, config.alpha, config.dropout, config.lr, config.weight_decay, config.warmup, config.clip,
            config.epochs, config.grad_accum, config.max_length) == (32, 32, 0.0, 1e-4, 0.0, 0.05, 1.0, 1, 8, 81_920)
    assert config.targets == TARGETS and len(set(config.targets)) == 12
    assert (config.gradient_checkpointing, config.offload_activations, config.mlp_chunk, config.loss_chunk) == \
        (True, True, 8192, 2048)
    assert resolve_dtype(config.dtype, "cuda") == "bfloat16" and resolve_dtype(config.dtype, "cpu") == "float32"
    assert resolve_dtype("float32", "cuda") == "float32"


def test_bad_memory_settings_name_the_file_and_field(tmp_path):
    path = tmp_path / "rft.toml"
    path.write_text('base = "b"\nrows = "r"\nout = "o"\nloss_chunk = -1\n')
    with pytest.raises(ValueError, match="rft.toml: loss_chunk must be a whole number"):
        load_config(path)
    path.write_text('base = "b"\nrows = "r"\nout = "o"\ndtype = "bf16"\n')
    with pytest.raises(ValueError, match="rft.toml: dtype must be"):
        load_config(path)


def test_an_unreadable_config_names_the_file_and_key(tmp_path):
    """load_config reads through submission.strict_toml: a missing file, invalid TOML, an unknown or mistyped key
    (top level or in [corpus]) stop the run before it starts, naming the file and the key."""
    path = tmp_path / "rft.toml"
    with pytest.raises(TomlError, match=r"rft\.toml: cannot read"):
        load_config(path)
    path.write_text('base = "b"\nrows = "r"\nout = \n')
    with pytest.raises(TomlError, match=r"rft\.toml: not valid TOML"):
        load_config(path)
    path.write_text('base = "b"\nrows = "r"\nout = "o"\nrnak = 8\n')
    with pytest.raises(TomlError, match=r"rft\.toml: unknown key\(s\) rnak"):
        load_config(path)
    path.write_text('base = "b"\nrows = "r"\nout = "o"\nrank = "32"\n')
    with pytest.raises(TomlError, match=r"rft\.toml\.rank: expected int, got str"):
        load_config(path)
    path.write_text('base = "b"\nrows = "r"\nout = "o"\n[corpus]\ndir = "c"\nratio = 0.25\n')
    with pytest.raises(TomlError, match=r"rft\.toml\.corpus: unknown key\(s\) ratio"):
        load_config(path)
    path.write_text('base = "b"\nrows = "r"\nout = "o"\n[corpus]\ndir = "c"\nfraction = 0.25\n')
    assert (load_config(path).corpus.dir, load_config(path).corpus.fraction) == ("c", 0.25)


def test_the_command_line_refuses_a_bad_config_with_exit_2(tmp_path, capsys):
    path = tmp_path / "rft.toml"
    path.write_text('base = "b"\nrows = "r"\nout = "o"\ntargets = "q_proj"\n')
    assert main(["--config", str(path)]) == 2
    assert "rft.toml.targets: expected an array, got str" in capsys.readouterr().err


def test_fused_projections_are_mapped_only_whole():
    qwen3_5 = {"q_proj", "in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj"}
    qwen3_next = {"q_proj", "in_proj_qkvz", "in_proj_ba", "out_proj"}
    linear = ("in_proj_qkv", "in_proj_z", "in_proj_b", "in_proj_a", "out_proj")
    assert resolve_targets(linear, qwen3_5) == list(linear)
    assert resolve_targets(linear, qwen3_next) == ["in_proj_qkvz", "in_proj_ba", "out_proj"]
    assert resolve_targets(("in_proj_qkvz", "q_proj"), qwen3_next) == ["in_proj_qkvz", "q_proj"]
    with pytest.raises(ValueError, match="in_proj_qkv: the model fuses it with in_proj_qkv and in_proj_z"):
        resolve_targets(("in_proj_qkv", "q_proj"), qwen3_next)  # adapting the fused layer would adapt z as well
    with pytest.raises(ValueError, match="in_proj_qkvz match no Linear"):
        resolve_targets(("in_proj_qkvz",), qwen3_5)


def test_memory_plan_and_slices():
    assert spans(700, 128)[-1] == (640, 700) and len(spans(700, 128)) == 6 and spans(5, 0) == [(0, 5)]
    on_gpu = memory_plan(True, True, 8192, 2048, "peft", "cuda:0")
    assert (on_gpu.reentrant, on_gpu.offload, on_gpu.pin_memory) == (True, True, True)
    assert memory_plan(True, True, 8192, 2048, "peft", "cpu").pin_memory is False  # a CPU-only torch cannot pin
    unsloth = memory_plan(True, True, 8192, 2048, "unsloth", "cuda")  # its checkpointing offloads already
    assert (unsloth.offload, unsloth.mlp_chunk, unsloth.loss_chunk) == (False, 8192, 2048)
