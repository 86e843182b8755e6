"""Zero the output-head rows of the end-of-turn and end-of-text tokens, so thinking is never cut short by them.

    python -m build.patch_eot --model DIR --out DIR

Reasoning models sometimes sample end of turn in the middle of their thinking (SPEC section 2). With those rows at
zero their logits are exactly 0, far below a trained model's top logits, so top-k/top-p sampling never picks them;
the answer grammar still admits end of turn after the program, where it is the only choice. No logit bias is needed
(vLLM refuses logit bias with speculative decoding). The token ids come from the tokenizer and the generation config,
never from constants. A head tied to the input embeddings is untied first (zeroing a tied row would also zero the
token's input embedding). The patch is recorded in config.json (`arc_kit_patches`) and a second patch is refused.
The checkpoint streams shard by shard through compressed-tensors' converter; only the head's shard changes.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from build.checkpoint import CheckpointError, text_prefix

PATCH_KEY = "arc_kit_patches"
END_TOKENS = ("<|im_end|>", "<|endoftext|>")
HEAD = "lm_head.weight"  # the embedding is `{text prefix}embed_tokens.weight` (build.checkpoint.text_prefix)


class PatchError(ValueError):
    """A checkpoint that cannot be patched; the message names it and why."""


def end_token_ids(tokenizer, generation_config: dict | None = None) -> list[int]:
    """End-of-turn and end-of-text ids: the tokenizer's eos, the named end tokens, the generation config's eos."""
    vocab = tokenizer.get_vocab()
    ids = {vocab[t] for t in END_TOKENS if t in vocab}
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    eos = (generation_config or {}).get("eos_token_id")
    ids.update(eos if isinstance(eos, list) else [eos] if eos is not None else [])
    return sorted(ids)


class EndOfTurnPatch:
    """A compressed-tensors converter: zero the head rows of `ids`; with `untie`, make the head from the embedding."""

    def __init__(self, ids: list[int], untie: bool, embed: str = "model.embed_tokens.weight"):
        self.ids, self.untie, self.embed = ids, untie, embed

    def process(self, tensors: dict) -> dict:
        out = dict(tensors)
        if self.untie and self.embed in tensors:
            out[HEAD] = tensors[self.embed].clone()
        if HEAD in out:
            head = out[HEAD].clone()
            head[self.ids] = 0
            out[HEAD] = head
        return out

    def validate(self, tensors: dict) -> dict:
        return self.process(tensors)

    def update_config(self, config):
        return config

    def update_model_config(self, model_config: dict) -> dict:
        if self.untie:
            model_config["tie_word_embeddings"] = False
            if "text_config" in model_config:
                model_config["text_config"]["tie_word_embeddings"] = False
        model_config[PATCH_KEY] = {"end_of_turn_rows_zeroed": self.ids, "untied": self.untie}
        return model_config

    def get_dependencies(self, weight_name: str) -> set[str]:
        return set()


def patch(model: str | Path, out: str | Path) -> list[int]:
    from compressed_tensors.entrypoints.convert import convert_checkpoint
    from transformers import AutoTokenizer

    model, out = Path(model), Path(out)
    config = json.loads((model / "config.json").read_text())
    if PATCH_KEY in config and "end_of_turn_rows_zeroed" in config[PATCH_KEY]:
        raise PatchError(f"{model}: already patched (config.json {PATCH_KEY}: {config[PATCH_KEY]}); refusing twice")
    if out.exists():
        raise PatchError(f"{out}: already exists; refusing to overwrite")
    generation = model / "generation_config.json"
    ids = end_token_ids(AutoTokenizer.from_pretrained(model),
                        json.loads(generation.read_text()) if generation.exists() else None)
    if not ids:
        raise PatchError(f"{model}: the tokenizer names no end-of-turn or end-of-text token")
    tied = bool(config.get("tie_word_embeddings", config.get("text_config", {}).get("tie_word_embeddings", False)))
    index = model / "model.safetensors.index.json"
    names = set(json.loads(index.read_text())["weight_map"]) if index.exists() else _names(model)
    untie = tied or HEAD not in names
    try:
        embed = text_prefix(names) + "embed_tokens.weight"
    except CheckpointError:
        embed = None
    if untie and embed is None:
        raise PatchError(f"{model}: no {HEAD} and no text-model embedding to make one from")
    partial = out.with_name(out.name + ".partial")
    convert_checkpoint(str(model), str(partial), converter=EndOfTurnPatch(ids, untie, embed), max_workers=1,
                       device="cpu")
    partial.rename(out)
    return ids


def _names(model: Path) -> set[str]:
    from safetensors import safe_open

    names: set[str] = set()
    for file in model.glob("*.safetensors"):
        with safe_open(file, framework="pt") as f:
            names.update(f.keys())
    return names


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m build.patch_eot", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    try:
        ids = patch(args.model, args.out)
    except PatchError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{args.out}: output-head rows {ids} zeroed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
