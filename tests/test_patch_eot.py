"""The end-of-turn patch: exactly the end rows of the output head become zero, nothing else changes, tied heads are
untied first, a second patch is refused. Needs the build environment (make build-env)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("compressed_tensors.entrypoints.convert.converters.magnitude_expert_pruner",
                    reason="the patch streams through the build environment's compressed-tensors")

import torch  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer  # noqa: E402

from build.models.tiny import make_checkpoint  # noqa: E402
from build.patch_eot import PATCH_KEY, PatchError, patch  # noqa: E402


@pytest.mark.parametrize("tied", [False, True])
def test_patch_zeroes_exactly_the_end_rows(tmp_path, tied, read_tensors):
    source = make_checkpoint(tmp_path / "model", "qwen3", seed=0, max_shard_size="300KB", patched=False, tied=tied)
    ids = patch(source, tmp_path / "patched")
    tokenizer = AutoTokenizer.from_pretrained(source)
    assert ids == sorted({tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.convert_tokens_to_ids("<|endoftext|>")})
    before, after = read_tensors(source), read_tensors(tmp_path / "patched")
    head_before = before["model.embed_tokens.weight"] if tied else before["lm_head.weight"]
    head = after["lm_head.weight"]
    assert torch.count_nonzero(head[ids]) == 0
    keep = [i for i in range(head.shape[0]) if i not in ids]
    assert torch.equal(head[keep], head_before[keep])
    assert torch.equal(after["model.embed_tokens.weight"], before["model.embed_tokens.weight"])  # inputs untouched
    assert set(after) == set(before) | {"lm_head.weight"}
    assert all(torch.equal(after[k], before[k]) for k in before if k != "lm_head.weight")
    config = json.loads((tmp_path / "patched" / "config.json").read_text())
    assert config[PATCH_KEY] == {"end_of_turn_rows_zeroed": ids, "untied": tied} and config["tie_word_embeddings"] is False

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "patched", dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([[5, 6, 7, 8]])).logits
    assert torch.count_nonzero(logits[..., ids]) == 0 and torch.count_nonzero(logits[..., keep]) > 0
    if tied:
        assert not torch.equal(model.lm_head.weight, model.model.embed_tokens.weight)

    with pytest.raises(PatchError, match="already patched"):
        patch(tmp_path / "patched", tmp_path / "twice")


def test_tiny_checkpoints_come_patched(tmp_path):
    source = make_checkpoint(tmp_path / "model", "qwen3", seed=0)
    with pytest.raises(PatchError, match="already patched"):
        patch(source, tmp_path / "again")


def test_tiny_tied_and_patched_keeps_the_input_embeddings(tmp_path, read_tensors):
    """`build.models.tiny --tied` unties the head before zeroing its end rows, as the patch does: zeroing a tied head
    used to zero the end tokens' input embeddings too."""
    make_checkpoint(tmp_path / "model", "qwen3", seed=0, tied=True)  # what `build.models.tiny --tied` makes
    tensors = read_tensors(tmp_path / "model")
    config = json.loads((tmp_path / "model" / "config.json").read_text())
    ids = config[PATCH_KEY]["end_of_turn_rows_zeroed"]
    assert config[PATCH_KEY]["untied"] is True and config["tie_word_embeddings"] is False
    assert torch.count_nonzero(tensors["lm_head.weight"][ids]) == 0
    plain = read_tensors(make_checkpoint(tmp_path / "plain", "qwen3", seed=0, patched=False, tied=True))
    assert torch.equal(tensors["model.embed_tokens.weight"], plain["model.embed_tokens.weight"])  # inputs untouched
    keep = [i for i in range(tensors["lm_head.weight"].shape[0]) if i not in ids]
    assert torch.equal(tensors["lm_head.weight"][keep], tensors["model.embed_tokens.weight"][keep])
