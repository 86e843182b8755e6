"""Drop experts from a mixture-of-experts checkpoint, shard by shard, without loading the model.

    python -m build.prune --model DIR --list LIST.json --out DIR

LIST.json is an expert list from `build.prune.experts` (`{"experts": [[kept expert indices] per MoE layer], ...}`). Each
removed expert's tensors and router rows go, the kept experts are renumbered in their original order, the expert count
in config.json is rewritten under every expert-count key it has (`num_experts`, `num_local_experts`,
`n_routed_experts`, also in `text_config`: transformers refuses a config whose keys disagree), and the shard index is
rebuilt. The MTP layer (`mtp.*`, loaded by vLLM, ignored by transformers) is a mixture of experts built from the same
count, so it keeps the same number of experts: those with the largest router-row norms.

The output is what compressed-tensors' streaming converter (`convert_checkpoint` driving its `MagnitudeExpertPruner`
with our `retained_experts`) writes, byte for byte (tests/test_prune.py builds that reference and compares the files),
but not by way of torch: a pruned checkpoint is its source less some tensors, so each kept tensor's bytes are handed
from the memory-mapped source shard straight to safetensors' serialiser (`serialize_file` with pointers), and only
router rows are gathered. The converter loaded every tensor, sliced it and saved it again: ~0.1x a copy's throughput
(benchmarks/RESULTS.md).

A compressed-tensors checkpoint (the community W4A16 one the study served, or build.quantize's output) is pruned the
same way: every tensor of a dropped expert goes (`weight_packed`, `weight_scale`, `weight_shape`, `weight_zero_point`,
`weight_global_scale`, ...: whatever follows `experts.E.{gate,up,down}_proj.`), the kept experts' tensors are renamed
byte for byte, the router (BF16 in those checkpoints) loses its rows, and the expert module names the
`quantization_config` lists (its `targets` and `ignore`) are renamed or dropped alike; names it matches by pattern or
class stay. Every scheme quantises each expert on its own (scales per group or channel; NVFP4's global scale is one
per expert's gate/up pair), so the result is what quantising the pruned BF16 checkpoint writes (tests/test_prune.py).
Lists with unequal counts per layer, unknown layers, out-of-range or duplicate experts, or fewer experts than the
model routes to per token are refused before any work, as is a checkpoint quantised by another method than
compressed-tensors (its tensors' names are not known here).
The output is written to `OUT.partial` and renamed to `OUT` only when complete, with `pruning.json` recording the
list, its provenance and the source checkpoint.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from build.checkpoint import DTYPES, CheckpointError, checkpoint_files, copy_other_files, read_header, weight_map

ROUTER = r"(?:^|\.)layers\.(\d+)\.mlp\.gate\.weight$"
EXPERT = r"\.mlp\.experts\.\d+\.(?:gate|up|down)_proj\.[a-z_]+$"  # `weight`, or compressed-tensors' parts
MTP_ROUTER = r"^mtp\..*\.mlp\.gate\.weight$"
EXPERT_COUNT_KEYS = ("num_experts", "num_local_experts", "moe_num_experts", "n_routed_experts")  # compressed-tensors'
PER_TOKEN_KEYS = ("top_k_experts", "num_experts_per_tok")
EXPERT_INDEX = re.compile(r"\.experts\.(\d+)\.")


class PruneError(CheckpointError):
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


def config_value(config: dict, keys: tuple[str, ...]) -> tuple[str, int] | None:
    """The first of `keys` the config has (top level, then text_config) and its value. Pure."""
    for key in keys:
        for level in (config, config.get("text_config") or {}):
            if level.get(key) is not None:
                return key, int(level[key])
    return None


def router_rows(path: Path, name: str) -> np.ndarray:
    """A bf16, f16 or f32 router weight from its shard as float32 rows (numpy has no bfloat16: its bits are the top
    half of a float32's)."""
    start, header = read_header(path)
    info = header[name]
    begin, end = info["data_offsets"]
    raw = np.fromfile(path, dtype=np.uint8, count=end - begin, offset=start + begin)
    if info["dtype"] == "BF16":
        values = (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    elif info["dtype"] in ("F16", "F32"):
        values = raw.view(np.float16 if info["dtype"] == "F16" else np.float32).astype(np.float32)
    else:
        raise PruneError(f"{path}: router {name} has dtype {info['dtype']}")
    return values.reshape(info["shape"][0], -1)


def _mtp_retained(names: list[str], weights: dict, model: Path, keep: int) -> dict[str, list[int]]:
    """Each MTP router's `keep` experts with the largest row norms, in index order."""
    out = {}
    for name in names:
        norms = np.linalg.norm(router_rows(model / weights[name], name), axis=-1)
        out[name] = sorted(np.argsort(-norms, kind="stable")[:keep].tolist())
    return out


def kept_tensors(names: list[str], retained: dict[str, list[int]], source: str) -> dict[str, str]:
    """Old name -> name in the pruned checkpoint, for every tensor that stays: an expert's tensors are renumbered
    among its layer's kept experts (`experts.5.` -> `experts.1.` when [2, 5] are kept) or dropped; everything else
    keeps its name (routers keep theirs and lose rows: `retained`). Pure."""
    renumber = {router: {old: new for new, old in enumerate(kept)} for router, kept in retained.items()}
    routers = expert_to_router([n for n in names if re.search(EXPERT, n)], set(retained), source)
    out = {}
    for name in names:
        router = routers.get(name)
        if router is None:
            out[name] = name
            continue
        match = EXPERT_INDEX.search(name)
        new = renumber[router].get(int(match.group(1)))
        if new is not None:
            out[name] = f"{name[:match.start()]}.experts.{new}.{name[match.end():]}"
    return out


def module_renames(names: dict[str, str], dropped: set[str]) -> tuple[dict[str, str], set[str]]:
    """(old module -> new module for the renamed experts' projections, the dropped ones) from the tensor renames
    (`kept_tensors`) and the dropped tensor names. Pure."""
    return ({old.rpartition(".")[0]: new.rpartition(".")[0] for old, new in names.items() if old != new},
            {name.rpartition(".")[0] for name in dropped})


def pruned_quantization_config(quantization: dict, modules: dict[str, str], gone: set[str]) -> dict:
    """A compressed-tensors `quantization_config` with its module names (config groups' `targets`, `ignore`) renamed
    as the expert tensors are (`experts.5.up_proj` -> `experts.1.up_proj`, `module_renames`) and dropped experts'
    names removed; a renamed list is sorted, as build.quantize writes it. Patterns (`re:...`) and class names stay.
    Pure."""

    def rename(targets: list[str]) -> list[str]:
        if not any(t in modules or t in gone for t in targets):
            return targets
        return sorted(modules.get(t, t) for t in targets if t not in gone)

    out = dict(quantization)
    out["config_groups"] = {key: dict(group, targets=rename(group.get("targets", [])))
                            for key, group in quantization.get("config_groups", {}).items()}
    if out.get("ignore"):
        out["ignore"] = rename(out["ignore"])
    return out


def prune_shard(source: Path, target: Path, names: dict[str, str], retained: dict[str, list[int]]) -> dict[str, int]:
    """Write `target` with the tensors of `source` that `names` keeps, renamed, routers cut to their `retained` rows;
    returns the written tensors' sizes. Kept tensors go from the memory-mapped source to the serialiser by pointer."""
    from safetensors import TensorSpec, serialize_file

    start, header = read_header(source)
    data = np.memmap(source, dtype=np.uint8, mode="r")
    specs, alive, sizes = {}, [], {}
    for name, info in header.items():
        if name == "__metadata__" or name not in names:
            continue
        if info["dtype"] not in DTYPES:
            raise PruneError(f"{source}: tensor {name} has dtype {info['dtype']}, which pruning does not handle")
        begin, end = info["data_offsets"]
        view, shape = data[start + begin:start + end], info["shape"]
        if name in retained:  # a router: its kept experts' rows, in order
            view = np.ascontiguousarray(view.reshape(shape[0], -1)[retained[name]])
            shape = [len(retained[name]), *shape[1:]]
            alive.append(view)
        specs[names[name]] = TensorSpec(dtype=DTYPES[info["dtype"]], shape=shape, data_ptr=view.ctypes.data,
                                        data_len=view.nbytes)
        sizes[names[name]] = view.nbytes
    serialize_file(specs, str(target), metadata=None)
    del alive, data
    return sizes


def prune(model: str | Path, list_path: str | Path, out: str | Path, on_shard=None) -> Path:
    """Prune `model` by the list at `list_path` into `out`; `on_shard(done, total)` after each shard is written.
    Needs numpy and safetensors only: no torch, so the command starts in a fraction of a second."""
    model, out = Path(model), Path(out)
    if out.exists():
        raise PruneError(f"{out}: already exists; refusing to overwrite")
    experts, raw_list = load_list(list_path)
    files = checkpoint_files(model)
    weights = weight_map(files)
    config = json.loads((model / "config.json").read_text())
    quantization = config.get("quantization_config")
    if quantization is not None and quantization.get("quant_method") != "compressed-tensors":
        raise PruneError(f"{model}/config.json: quantization_config.quant_method is "
                         f"{quantization.get('quant_method')!r}: only compressed-tensors checkpoints (or unquantised "
                         "ones) are pruned here")
    found = config_value(config, EXPERT_COUNT_KEYS)
    if found is None:
        raise PruneError(f"{model}/config.json: none of {', '.join(EXPERT_COUNT_KEYS)} (not a mixture of experts)")
    key, num_experts = found
    per_token = config_value(config, PER_TOKEN_KEYS)
    routers = {int(m.group(1)): n for n in weights if (m := re.search(ROUTER, n)) and not n.startswith("mtp.")}
    validate_list(experts, routers, num_experts, per_token and per_token[1], str(list_path))
    retained = {routers[layer]: sorted(experts[i]) for i, layer in enumerate(sorted(routers))}
    mtp_routers = [n for n in weights if re.search(MTP_ROUTER, n)]
    retained.update(_mtp_retained(mtp_routers, weights, model, len(experts[0])))
    names = kept_tensors(list(weights), retained, str(model))
    modules, gone = module_renames(names, set(weights) - set(names))
    if quantization is not None:
        config = dict(config, quantization_config=pruned_quantization_config(quantization, modules, gone))
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    shards = [name for name in files if name.endswith(".safetensors")]
    total, new_map = 0, {}
    copy_other_files(files, partial)
    report = partial / "quantization_report.json"  # build.quantize's, per module: renamed as the modules are
    if report.exists():
        from build.quantize.quantizer import report_json  # numpy and json only: no torch

        rows = json.loads(report.read_text())
        rows["tensors"] = {modules.get(m, m): row for m, row in rows.get("tensors", {}).items() if m not in gone}
        report.write_text(report_json(rows))
    for done, name in enumerate(shards, 1):
        sizes = prune_shard(Path(files[name]), partial / name, names, retained)
        total += sum(sizes.values())
        new_map.update({tensor: Path(name).name for tensor in sizes})
        if on_shard is not None:
            on_shard(done, len(shards))
    index = next((name for name in files if name.endswith("safetensors.index.json")), "model.safetensors.index.json")
    (partial / index).write_text(json.dumps({"metadata": {"total_size": total}, "weight_map": new_map}, indent=2,
                                            sort_keys=True))
    (partial / "config.json").write_text(json.dumps(set_expert_count(config, len(experts[0])), indent=2,
                                                    sort_keys=True))
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
    from submission.progress import ProgressLine

    started, line = time.perf_counter(), ProgressLine()
    try:
        out = prune(args.model, args.list, args.out,
                    on_shard=lambda done, total: line.update(f"prune: shard {done}/{total}", final=done == total))
    except CheckpointError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    print(f"{out} (pruned in {time.perf_counter() - started:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
