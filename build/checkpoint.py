"""A safetensors checkpoint folder read without torch: its files, its shard index, a shard's header.

`build.prune` and `build.quantize` read shards by their headers from memory maps and write them by pointer; both list
and copy a checkpoint's files as compressed-tensors' streaming converter does, so their outputs keep its layout.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path


class CheckpointError(ValueError):
    """A checkpoint folder or shard that cannot be read; the message names the file and what is wrong."""


# safetensors' header dtypes -> the names its serialiser takes (torch's dtype names)
DTYPES = {"BF16": "bfloat16", "F16": "float16", "F32": "float32", "F64": "float64", "I64": "int64", "I32": "int32",
          "I16": "int16", "I8": "int8", "U8": "uint8", "BOOL": "bool", "F8_E4M3": "float8_e4m3fn",
          "F8_E5M2": "float8_e5m2"}


def checkpoint_files(model: Path) -> dict[str, Path]:
    """Every file of a checkpoint folder by its path relative to the folder (as compressed-tensors' converter copies
    them: recursively, less `.cache` and `.gitattributes`)."""
    if not (model / "config.json").is_file():
        raise CheckpointError(f"{model}: no config.json (not a checkpoint folder)")
    return {str(p.relative_to(model)): p for p in sorted(model.rglob("*"))
            if p.is_file() and not str(p.relative_to(model)).startswith((".cache", ".gitattributes"))}


def copy_other_files(files: dict[str, Path], target: Path) -> None:
    """Copy every file of a checkpoint but its safetensors shards into `target`, as compressed-tensors' converter
    does (a name ending in "safetensors" is a shard)."""
    for name, path in files.items():
        if not name.endswith("safetensors"):
            (target / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(path, target / name)


# where a checkpoint keeps its text model: Qwen3.5's multimodal release under `model.language_model.` (beside
# `model.visual.`), every other architecture here under `model.`
TEXT_PREFIXES = ("model.language_model.", "model.")


def text_prefix(names) -> str:
    """The prefix of the text model's weights (`model.language_model.` or `model.`) among a checkpoint's tensor
    names, found by its embedding. Pure."""
    for prefix in TEXT_PREFIXES:
        if f"{prefix}embed_tokens.weight" in names:
            return prefix
    raise CheckpointError(f"no text-model embedding among the tensors (looked for "
                          f"{', '.join(p + 'embed_tokens.weight' for p in TEXT_PREFIXES)})")


def weight_map(files: dict[str, Path]) -> dict[str, str]:
    """Tensor name -> shard file name: the index's, or the single `model.safetensors`'s header."""
    index = [path for name, path in files.items() if name.endswith("safetensors.index.json")]
    if index:
        try:
            return json.loads(index[0].read_text())["weight_map"]
        except (json.JSONDecodeError, KeyError) as err:
            raise CheckpointError(f"{index[0]}: no weight_map ({err})") from None
    if "model.safetensors" not in files:
        raise CheckpointError(f"{next(iter(files.values())).parent}: neither a safetensors index nor model.safetensors")
    return {name: "model.safetensors" for name in read_header(files["model.safetensors"])[1] if name != "__metadata__"}


def read_header(path: Path) -> tuple[int, dict]:
    """A safetensors file's header and where its data begins (the format: 8-byte little-endian length, JSON)."""
    with open(path, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        try:
            return 8 + size, json.loads(f.read(size))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise CheckpointError(f"{path}: not a safetensors file ({err})") from None
