"""The RFT v1 recipe's pure parts (SPEC 9): grid-only targets, the token-mean weights, the length limit, no weight
decay, and the KV-scale rule for re-quantisation. Core environment; the training loop itself is tests/test_rft.py."""

from __future__ import annotations

import pytest

from training.dataset import IGNORE, Row, grid_part, grid_target
from training.rft import TrainConfig, load_config, token_weights, within_length

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
    assert "in_proj_qkvz" in config.targets and "q_proj" in config.targets
    with pytest.raises(ValueError, match="calibration_tasks"):
        TrainConfig("b", "r", "o", recipe="build/recipes/dense-27b-4xL4.toml")
    assert TrainConfig("b", "r", "o", recipe="x.toml", kv_scales=False).recipe == "x.toml"
    path = tmp_path / "rft.toml"
    path.write_text('base = "b"\nrows = "r"\nout = "o"\ntargets = ["q_proj", "v_proj"]\n')
    assert load_config(path).targets == ("q_proj", "v_proj")
    path.write_text('base = "b"\nrows = "r"\nout = "o"\nrecipe = "x.toml"\n')
    with pytest.raises(ValueError, match="rft.toml: recipe: .*calibration_tasks"):
        load_config(path)
