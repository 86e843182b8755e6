"""Cut a Qwen3 checkpoint to the grid line's 16-token vocabulary (SPEC section 10).

    python -m build.models.grid_vocab --model DIR --out DIR

Each of the 16 tokens (submission/grid/format.py) is matched to one token of the source tokenizer: the digits,
newline, "I" and "O" by their text, padding / end / begin of sequence by <|endoftext|> / <|im_end|> / <|im_start|>.
The embedding and output-head rows of those tokens are kept (their trained values) and every other row dropped; a
tied head stays tied. If the head row of a token is all zero (build.patch_eot zeroes the end-of-turn rows so that
thinking is not cut short), the grid model would never end a grid, so that row is taken from the token's embedding
instead and the output's grid_vocab.json says so. The output gets a matching tokenizer (one token per character,
the three markers as special tokens), a config with vocab_size 16 and the new special ids, and grid_vocab.json
recording which source ids were kept. The cut writes the `kit16` format (submission/grid/format.py); a checkpoint
already cut to another format (NVARC's published 4B: `nvarc`) needs no cut, only its format named in the profile.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from build.patch_eot import PATCH_KEY
from submission.grid.format import BOS, EOS, PAD, TOKENS, VOCAB

SOURCE_SPECIAL = {PAD: "<|endoftext|>", EOS: "<|im_end|>", BOS: "<|im_start|>"}


def source_ids(tokenizer) -> list[int]:
    """The source tokenizer's id for each grid token, or ValueError naming the token that has no single id."""
    ids = []
    for index, text in enumerate(TOKENS):
        if index in SOURCE_SPECIAL:
            found = tokenizer.convert_tokens_to_ids(SOURCE_SPECIAL[index])
            found = [found] if found is not None and found != tokenizer.unk_token_id else []
        else:
            found = tokenizer.encode(text, add_special_tokens=False)
        if len(found) != 1:
            hint = (f" (a {len(tokenizer)}-token tokenizer is a grid cut already: NVARC's published 4B, say, runs as "
                    "it is with model.format = \"nvarc\" in the grid profile)" if len(tokenizer) <= 64 else "")
            raise ValueError(f"source tokenizer: token {text!r} is {found}, not one id{hint}")
        ids.append(found[0])
    return ids


def make_tokenizer():
    """A fast tokenizer over the 16 tokens: every character is one token; <pad>, <eos>, <bos> are special."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.WordLevel({t: i for i, t in enumerate(TOKENS)}, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(tokenizer_object=tok, pad_token=TOKENS[PAD], eos_token=TOKENS[EOS],
                                   bos_token=TOKENS[BOS])


def cut(model_dir: str | Path, out: str | Path) -> Path:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    source = AutoTokenizer.from_pretrained(model_dir)
    keep = source_ids(source)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype="auto")
    if model.config.model_type != "qwen3":
        raise ValueError(f"{model_dir}/config.json: model_type is {model.config.model_type!r}; "
                         "the grid line takes qwen3")
    tied = bool(model.config.tie_word_embeddings)
    index = torch.tensor(keep)
    with torch.no_grad():
        embedding = model.get_input_embeddings().weight[index].clone()
        head = model.get_output_embeddings().weight[index].clone()
        zero_rows = [TOKENS[i] for i in range(VOCAB) if not tied and not head[i].any()]
        for i in range(VOCAB):
            if TOKENS[i] in zero_rows:
                head[i] = embedding[i]
        new_embedding = torch.nn.Embedding(VOCAB, embedding.shape[1], dtype=embedding.dtype)
        new_embedding.weight.copy_(embedding)
        model.set_input_embeddings(new_embedding)
        new_head = torch.nn.Linear(embedding.shape[1], VOCAB, bias=False, dtype=head.dtype)
        new_head.weight.copy_(head)
        model.set_output_embeddings(new_head)
    config = model.config
    config.vocab_size = VOCAB
    config.eos_token_id, config.pad_token_id, config.bos_token_id = EOS, PAD, BOS
    if tied:
        model.tie_weights()
    if hasattr(config, PATCH_KEY):  # the end-of-turn patch's record no longer describes this head
        delattr(config, PATCH_KEY)
    model.generation_config.eos_token_id = EOS
    model.generation_config.pad_token_id = PAD
    model.generation_config.bos_token_id = BOS
    model.save_pretrained(out)
    make_tokenizer().save_pretrained(out)
    (out / "grid_vocab.json").write_text(json.dumps({
        "source": str(model_dir), "tokens": list(TOKENS), "source_ids": keep, "tied": tied,
        "head_rows_from_embedding": zero_rows, "made_by": "build.models.grid_vocab"}, indent=1))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m build.models.grid_vocab", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path, help="a Qwen3 checkpoint folder")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    print(cut(args.model, args.out))


if __name__ == "__main__":
    main()
