"""build.models.grid_vocab on a tiny Qwen3: 16 rows kept with their trained values, a tokenizer that agrees with the
format's ids on real tasks, and a checkpoint the grid line loads."""

from __future__ import annotations

import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from submission.grid.format import BOS, EOS, TOKENS, VOCAB, encode  # noqa: E402
from submission.tasks import load_tasks  # noqa: E402


pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def made(tmp_path_factory):
    from build.models.grid_vocab import main
    from build.models.tiny import make_checkpoint

    root = tmp_path_factory.mktemp("grid-vocab")
    base = make_checkpoint(root / "base", "qwen3", seed=1)
    main(["--model", str(base), "--out", str(root / "grid")])
    return base, root / "grid"


def test_rows_are_the_source_rows_of_the_16_tokens(made, read_tensors):
    from transformers import AutoTokenizer

    base, grid = made
    source, cut = read_tensors(base), read_tensors(grid)
    record = json.loads((grid / "grid_vocab.json").read_text())
    source_tok = AutoTokenizer.from_pretrained(base)
    assert record["source_ids"][:10] == [source_tok.convert_tokens_to_ids(str(d)) for d in range(10)]
    assert record["source_ids"][EOS] == source_tok.convert_tokens_to_ids("<|im_end|>")
    ids = torch.tensor(record["source_ids"])
    emb = "model.embed_tokens.weight"
    assert cut[emb].shape[0] == VOCAB and torch.equal(cut[emb], source[emb][ids])
    head = source["lm_head.weight"][ids]
    # build.models.tiny zeroes the end-of-turn head rows (<|im_end|>, <|endoftext|>): those come from the embedding
    assert record["head_rows_from_embedding"] == ["<pad>", "<eos>"]
    for i in range(VOCAB):
        expected = source[emb][ids[i]] if TOKENS[i] in ("<pad>", "<eos>") else head[i]
        assert torch.equal(cut["lm_head.weight"][i], expected), TOKENS[i]
    config = json.loads((grid / "config.json").read_text())
    assert config["vocab_size"] == VOCAB and config["eos_token_id"] == EOS and config["bos_token_id"] == BOS
    assert "arc_kit_patches" not in config
    for name, tensor in source.items():  # everything else is untouched
        if name not in (emb, "lm_head.weight"):
            assert torch.equal(cut[name], tensor), name


def test_tokenizer_agrees_with_the_format_on_real_tasks(made, arc_data):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(made[1])
    assert len(tokenizer) == VOCAB
    for task in load_tasks(arc_data / "arc-agi-2" / "training").tasks[:50]:
        ids = list(encode(task.train, task.test_inputs[0], task.test_outputs[0], max_len=1 << 20).ids)
        text = "".join(TOKENS[i] for i in ids)
        assert tokenizer(text)["input_ids"] == ids, task.id
        assert tokenizer.decode(ids) == text


def test_the_grid_model_loads_and_refuses_other_vocabularies(made):
    from submission.grid.model import load_model

    model = load_model(made[1], "float32")
    assert model.lm_head.weight.shape[0] == VOCAB
    with pytest.raises(ValueError, match=r"vocab_size is \d+, the grid line needs 16"):
        load_model(made[0], "float32")
