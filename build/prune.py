"""Drop experts from a mixture-of-experts checkpoint, shard by shard, without loading the model.

    python -m build.prune --model DIR --list LIST.json --out DIR

LIST.json is an expert list from `build.experts` (`{"experts": [[kept expert indices] per MoE layer], ...}`). The
rewrite is compressed-tensors' streaming converter (`convert_checkpoint`, one shard plus its dependencies in memory)
driving its `MagnitudeExpertPruner` with our own `retained_experts` mapping instead of its magnitude scores: each
removed expert's tensors and router rows go, the kept experts are renumbered in their original order, the expert
count in config.json is rewritten under every expert-count key it has (`num_experts`, `num_local_experts`,
`n_routed_experts`, also in `text_config`: the library edits only one, and transformers refuses a config whose keys
disagree), and the shard index is rebuilt. The MTP layer
(`mtp.*`, loaded by vLLM, ignored by transformers) is a mixture of experts built from the same count, so it keeps the
same number of experts: those with the largest router-row norms.

Lists with unequal counts per layer, unknown layers, out-of-range or duplicate experts, or fewer experts than the
model routes to per token are refused before any work. The output is written to `OUT.partial` and renamed to `OUT`
only when complete, with `pruning.json` recording the list, its provenance and the source checkpoint.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

from build.library_logs import show_library_logs_from

ROUTER = r"(?:^|\.)layers\.(\d+)\.mlp\.gate\.weight$"
EXPERT = r"\.mlp\.experts\.\d+\.(?:gate|up|down)_proj\.weight$"
MTP_ROUTER = r"^mtp\..*\.mlp\.gate\.weight$"
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts")


class PruneError(ValueError):
    """A list or checkpoint that cannot be pruned; the message names the file and what is wrong."""


def load_list(path: str | Path) -> tuple[list[list[int]], dict]:
    path = Path(path)
    try:
        raw = json.loads(path.read_text())
        experts = [list(map(int, layer)) for layer in raw["experts"]]
    except (OSError, json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise PruneError(f"{path}: not an expert list ({err})") from None
    return experts, raw


def validate_list(experts: list[list[int]], routers: dict[int, str], num_experts: int, per_token: int | None,
                  source: str) -> None:
    """Refuse what would produce a broken checkpoint (pure; the message names the list and the layer)."""
    if len(experts) != len(routers):
        raise PruneError(f"{source}: {len(experts)} layers in the list, the checkpoint has {len(routers)} MoE layers "
                         f"({sorted(routers)[:4]}...)")
    counts = {len(layer) for layer in experts}
    if len(counts) != 1:
        raise PruneError(f"{source}: unequal expert counts per layer {sorted(counts)}: the config has one count")
    for position, layer in enumerate(experts):
        if len(set(layer)) != len(layer):
            raise PruneError(f"{source}: layer {position} lists an expert twice")
        bad = [e for e in layer if not 0 <= e < num_experts]
        if bad:
            raise PruneError(f"{source}: layer {position} has experts {bad} outside 0..{num_experts - 1}")
    if per_token is not None and counts.pop() < per_token:
        raise PruneError(f"{source}: fewer experts per layer than the {per_token} routed to per token")


def set_expert_count(config: dict, count: int) -> dict:
    """The config with every expert-count key it has (top level and text_config) set to `count`. Pure."""
    out = dict(config)
    for key in EXPERT_COUNT_KEYS:
        if key in out:
            out[key] = count
    if isinstance(out.get("text_config"), dict):
        out["text_config"] = set_expert_count(out["text_config"], count)
    return out


def expert_to_router(expert_names: list[str], routers: set[str], source: str) -> dict[str, str]:
    """Each expert tensor's router (`P.mlp.experts.E.up_proj.weight` -> `P.mlp.gate.weight`), by name in O(1). The
    library's `build_expert_to_router_map` compares every expert with every router (40 s of 93 for the 80B topology's
    75k tensors). Pure."""
    out = {}
    for name in expert_names:
        router = name.split(".experts.", 1)[0] + ".gate.weight"
        if router not in routers:
            raise PruneError(f"{source}: expert tensor {name} has no router {router}")
        out[name] = router
    return out


def _mtp_retained(model: Path, names: list[str], weight_map: dict, files: dict, keep: int) -> dict[str, list[int]]:
    from safetensors import safe_open

    out = {}
    for name in names:
        with safe_open(files[weight_map[name]], framework="pt") as f:
            norms = f.get_tensor(name).float().norm(dim=-1)
        out[name] = sorted(norms.argsort(descending=True)[:keep].tolist())
    return out


def prune(model: str | Path, list_path: str | Path, out: str | Path) -> Path:
    from compressed_tensors.entrypoints.convert import convert_checkpoint
    from compressed_tensors.entrypoints.convert.converters.magnitude_expert_pruner import MagnitudeExpertPruner
    from compressed_tensors.utils.moe import (extract_expert_index, get_num_experts_config_key,
                                              get_num_experts_per_tok, load_model_config)
    from compressed_tensors.utils.safetensors_load import get_checkpoint_files, get_weight_map

    model, out = Path(model), Path(out)
    if out.exists():
        raise PruneError(f"{out}: already exists; refusing to overwrite")
    experts, raw_list = load_list(list_path)
    files = get_checkpoint_files(str(model))
    weight_map = get_weight_map(files)
    config = load_model_config(files)
    key = get_num_experts_config_key(config)
    num_experts = config.get(key) or config.get("text_config", {}).get(key)
    routers = {int(m.group(1)): n for n in weight_map if (m := re.search(ROUTER, n)) and not n.startswith("mtp.")}
    validate_list(experts, routers, num_experts, get_num_experts_per_tok(config), str(list_path))
    retained = {routers[layer]: sorted(experts[i]) for i, layer in enumerate(sorted(routers))}
    mtp_routers = [n for n in weight_map if re.search(MTP_ROUTER, n)]
    retained.update(_mtp_retained(model, mtp_routers, weight_map, files, len(experts[0])))
    router_names = list(retained)
    expert_names = [n for n in weight_map if re.search(EXPERT, n)]
    pruner = MagnitudeExpertPruner(
        router_pattern="|".join([ROUTER, MTP_ROUTER]), expert_pattern=EXPERT, sparsity=1 - len(experts[0]) / num_experts,
        num_experts_config_key=key, retained_experts=retained,
        expert_to_router=expert_to_router(expert_names, set(router_names), str(model)),
        expert_indices={n: extract_expert_index(n) for n in expert_names}, is_3d=False,
        num_experts_per_tok=get_num_experts_per_tok(config))
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    convert_checkpoint(str(model), str(partial), converter=pruner, max_workers=1, device="cpu")
    written = partial / "config.json"
    written.write_text(json.dumps(set_expert_count(json.loads(written.read_text()), len(experts[0])), indent=2))
    (partial / "pruning.json").write_text(json.dumps({
        "source": str(model.resolve()), "list": str(Path(list_path).resolve()), "list_name": raw_list.get("name"),
        "list_provenance": {k: v for k, v in raw_list.items() if k != "experts"},
        "experts_per_layer": len(experts[0]), "experts_before": num_experts, "config_key": key,
        "kept": {name: kept for name, kept in retained.items()}}, indent=1))
    partial.rename(out)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m build.prune", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--list", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    show_library_logs_from("INFO")
    started = time.perf_counter()
    try:
        out = prune(args.model, args.list, args.out)
    except PruneError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{out} (pruned in {time.perf_counter() - started:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
