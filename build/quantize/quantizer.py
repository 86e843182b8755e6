"""Quantise a checkpoint by a recipe (TOML), shard by shard, into the compressed-tensors format vLLM loads.

    python -m build.quantize --model DIR --recipe build/recipes/moe-4xL4.toml --out DIR

A recipe is data: ordered rules from a module-name pattern (a regex on names such as `model.layers.3.mlp.experts.7.
up_proj`, optionally limited to a layer range) to a scheme; the first matching rule wins and unmatched modules stay
as they are (BF16). Schemes: `NVFP4A16` (E2M1 weights, FP8 E4M3 scale per 16, FP32 global scale; weight-only FP4
kernels on the L4), `NVFP4` (W4A4: the same weights and a calibrated input global scale), `FP8_DYNAMIC` (FP8 weights
per channel, dynamic per-token activations), `FP8` (per-tensor FP8 weights and a calibrated static input scale),
`W4A16` (symmetric INT4 weights, a BF16 scale per group of 128 inputs: compressed-tensors' preset of that name) and
`W8A16_CHANNEL` (symmetric INT8 weights, a BF16 scale per output channel), both in compressed-tensors'
`pack-quantized` format (the integers packed into int32 words, `weight_shape` beside them: what vLLM 0.33 runs through
its weight-only INT kernels, Marlin on the L4), and `BF16` (keep). Static schemes need `--calibration-tasks`
(build.quantize.input_scales).

Weights are quantised in float32 (bf16 division flips ~0.5% of the nibbles). Every set of weights vLLM fuses into
one linear shares one global scale (and one static input scale), since vLLM keeps only the first (INT schemes have
no global scale; their scales are per group or per channel, so the members need nothing shared): the groups come
from one table per architecture (build.quantize.fused: q/k/v, gate/up of dense MLPs, of each routed expert and of shared
experts), found in one pass over the names; a recipe giving a group's members different schemes, or quantising
nothing, is refused before any work, as is a source that is quantised already.
MTP layers (`mtp.*`, Qwen3-Next, Qwen3.5) are matched by the same rules as the decoder layers except layer-ranged ones
(the MTP layer is none of layers 0..N-1), as vLLM 0.33 looks them up: its MTP decoder layer and `mtp.fc` are built
with the checkpoint's quantization config under their checkpoint names (experts by expert 0's names). Qwen3-Next's
MTP builds its output head without one, so a recipe that quantises `lm_head` is refused for such a checkpoint with
MTP weights; Qwen3.5's builds it with the config, so its FP8 head is allowed (build.quantize.fused.UNQUANTISED_MTP_HEAD
names the vLLM line of each).

The output is what compressed-tensors' streaming converter (`convert_checkpoint` with a converter calling the
library's compressors tensor by tensor) writes, byte for byte (tests/test_quantize.py builds that reference,
tests/reference_quantize.py, and compares every file), but much faster: the shards are read by their headers and
memory-mapped (no torch load), each output shard holds what the converter's would (a fused group's members travel to
its first member's shard), kept tensors go to safetensors' serialiser by pointer, and a shard's NVFP4 weights are
quantised together by two compiled loops (build.quantize.nvfp4: the library's CPU fallbacks run ~10 M elements/s each,
~4 hours of an 80B model's experts on one core). FP8 weights (attention, a few per layer) go through the library's own
`FloatQuantizationCompressor`, INT weights through its `calculate_qparams` and `PackedQuantizationCompressor` (torch's
vectorised calls: ~19 M weights/s on two busy cores, 2026-12-04, so ~1 hour for an 80B model's experts there; a
compiled loop like build.quantize.nvfp4's would be the next step if that matters). The `quantization_config` in
config.json and the index are written by the library's writers. A per-tensor report (`quantization_report.json`: scheme,
relative error of the dequantised weight, computed in float32 where the library dequantises in bfloat16) comes with the
output. With `--calibration-tasks`, FP8 KV-cache scales calibrated on the solver's own prompts of those tasks
(build.quantize.kv_scales) are added too, with the `kv_cache_scheme` vLLM reads; they and the static input scales
(observed only when the recipe has a static scheme) come from one layer-by-layer pass over the prompts
(build.quantize.activations: one decoder layer resident, never the whole model).
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from build.checkpoint import DTYPES, checkpoint_files, copy_other_files, read_header, weight_map
from build.quantize.activations import activation_amax
from build.quantize.kv_scales import calibration_prompts, scales as kv_cache_scales
from build.quantize.library_logs import show_library_logs_from
from build.schemes import FORMATS, SCHEMES, STATIC, compression_scheme, dequantize, library_scheme
from submission import strict_toml

if TYPE_CHECKING:
    import torch

INT_GROUP = 128  # W4A16's group of inputs per scale (compressed-tensors' preset; vLLM's Marlin kernels take it)
LAYER = re.compile(r"\.layers\.(\d+)\.")


@dataclass(frozen=True)
class Rule:
    """One `[[rules]]` entry: modules whose name matches `pattern` (a regex), within the decoder layers `layers`
    (first, last; empty: any module), get `scheme`."""

    pattern: str
    scheme: str
    layers: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.scheme not in SCHEMES:
            raise ValueError(f"scheme must be one of {', '.join(SCHEMES)}, not {self.scheme!r}")
        try:
            re.compile(self.pattern)
        except re.error as err:
            raise ValueError(f"pattern {self.pattern!r}: {err}") from None
        if self.layers and (len(self.layers) != 2 or not all(type(n) is int for n in self.layers)
                            or not 0 <= self.layers[0] <= self.layers[1]):
            raise ValueError(f"layers must be [first, last] with 0 <= first <= last, not {list(self.layers)}")

    def applies(self, module: str) -> bool:
        """Whether the rule decides `module`'s scheme (a layer-ranged rule never applies to the MTP layer, none of the
        decoder layers 0..N-1)."""
        if self.layers:
            layer = None if module.startswith("mtp.") else LAYER.search(module)
            if layer is None or not self.layers[0] <= int(layer.group(1)) <= self.layers[1]:
                return False
        return re.search(self.pattern, module) is not None


@dataclass(frozen=True)
class Check:
    """A recipe's `[check]` table."""

    max_nll_increase: float = 0.02  # the likelihood check's threshold (build.check_quality)


@dataclass(frozen=True)
class Recipe:
    name: str
    rules: tuple[Rule, ...]
    check: Check = Check()

    def scheme_for(self, module: str) -> str:
        """The scheme of the first rule that applies to `module`; BF16 (kept) if none does."""
        return next((rule.scheme for rule in self.rules if rule.applies(module)), "BF16")


def load_recipe(path: str | Path) -> Recipe:
    """The recipe of a TOML file (submission.strict_toml): a missing file, invalid TOML, an unknown key, a value of
    the wrong type or a bad rule raise TomlError naming the file and the key (`FILE.rules[N]` for the Nth rule)."""
    raw = strict_toml.read(path)
    rules = raw.get("rules", [])
    if not isinstance(rules, list):
        raise strict_toml.TomlError(f"{path}.rules: expected [[rules]] tables, got {type(rules).__name__}")
    # strict_toml.build reads tables, not arrays of them: each rule is built as its own table
    rules = tuple(strict_toml.build(Rule, rule, f"{path}.rules[{number}]") for number, rule in enumerate(rules))
    return strict_toml.build(Recipe, {"name": Path(path).stem, **raw, "rules": rules}, str(path))


def plan(recipe: Recipe, tensors: dict[str, tuple[int, ...]], config: dict,
         source: str = "checkpoint") -> dict[str, str]:
    """Module -> scheme for every weight the recipe quantises (tensor name -> shape, from the shard headers; `config`:
    the checkpoint's config.json), refusing what vLLM could not load or what would be a silent no-op: nothing matched,
    a fused group split over schemes, a quantised `lm_head` beside MTP weights where vLLM's MTP builds its head
    unquantised. Pure; one pass over the names."""
    from build.quantize.fused import UNQUANTISED_MTP_HEAD, groups, model_type, table_for

    table = table_for(config)

    candidates = {}
    for name, shape in tensors.items():
        module = name[:-len(".weight")]
        if name.endswith(".weight") and len(shape) == 2 and not module.endswith("mlp.gate") and "embed" not in module:
            candidates[module] = recipe.scheme_for(module)
    schemes = {module: scheme for module, scheme in candidates.items() if scheme in FORMATS}
    if not schemes:
        raise ValueError(f"recipe {recipe.name!r}: its patterns {[r.pattern for r in recipe.rules]} match no "
                         f"quantisable weight of {source}")
    ragged = sorted(m for m, s in schemes.items() if s == "W4A16" and tensors[f"{m}.weight"][1] % INT_GROUP)
    if ragged:
        raise ValueError(f"recipe {recipe.name!r}: W4A16 needs input widths that are multiples of {INT_GROUP} "
                         f"(vLLM's group kernels), but {source} has e.g. {ragged[0]} of width "
                         f"{tensors[ragged[0] + '.weight'][1]} ({len(ragged)} such weights)")
    for fused, members in groups(candidates, table).items():
        split = {module: candidates[module] for module in members}
        if len(set(split.values())) > 1:
            raise ValueError(f"recipe {recipe.name!r}: {fused} is one linear in vLLM but its parts get different "
                             f"schemes {split}")
    head = UNQUANTISED_MTP_HEAD.get(model_type(config))
    if head and "lm_head" in schemes and any(name.startswith("mtp.") for name in tensors):
        raise ValueError(f"recipe {recipe.name!r} quantises lm_head, but {source} has MTP weights and vLLM 0.33's "
                         f"MTP for {model_type(config)} builds its output head without a quantization config: {head}")
    return schemes


def int_weights(weights: dict[str, "torch.Tensor"], scheme_name: str) -> dict[str, "torch.Tensor"]:
    """W4A16 / W8A16_CHANNEL weights by compressed-tensors' own calls: the scale of each group of 128 inputs (W4A16)
    or of each output channel by `calculate_qparams` on the float32 weights, rounded to bfloat16 (the dtype
    llm-compressor's checkpoints store and vLLM's kernels take) before `PackedQuantizationCompressor.compress` divides
    by it, so the stored scale is the one the integers were made with. Keys are module names; the result is keyed by
    full tensor name (`weight_packed` int32, `weight_scale` bfloat16, `weight_shape` int64). Pure (no I/O)."""
    import torch
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    scheme = compression_scheme(scheme_name)
    out = {}
    for name, w in weights.items():
        w = w.to(torch.float32)
        parts = w.reshape(w.shape[0], -1, INT_GROUP) if scheme_name == "W4A16" else w.unsqueeze(1)
        scale, _ = calculate_qparams(parts.amin(-1), parts.amax(-1), scheme.weights)
        state = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale.to(torch.bfloat16)},
                                                      scheme)
        out.update({f"{name}.{k}": v for k, v in state.items()})
    return out


def fp8_weights(weights: dict[str, "torch.Tensor"], scheme_name: str,
                extra: dict[str, "torch.Tensor"] | None = None) -> dict[str, "torch.Tensor"]:
    """FP8 weights of one fused group (or one module) by compressed-tensors' own calls: per channel (FP8_DYNAMIC) or
    per tensor (FP8); keys are module names, the result is keyed by full tensor name; `extra` (a static input scale)
    is copied to every member. Pure (no I/O)."""
    import torch
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.quantization.utils.helpers import calculate_qparams

    scheme = compression_scheme(scheme_name)
    out = {}
    for name, w in weights.items():
        w = w.to(torch.float32)
        if scheme_name == "FP8":  # per tensor
            scale, _ = calculate_qparams(w.min().reshape(1), w.max().reshape(1), scheme.weights)
        else:  # per output channel
            scale, _ = calculate_qparams(w.amin(1, keepdim=True), w.amax(1, keepdim=True), scheme.weights)
        state = FloatQuantizationCompressor.compress({"weight": w, "weight_scale": scale}, scheme)
        out.update({f"{name}.{k}": v for k, v in state.items()})
        out.update({f"{name}.{k}": v.clone() for k, v in (extra or {}).items()})
    return out


def static_input(scheme_name: str, amax: float) -> dict[str, "torch.Tensor"]:
    """The calibrated input scale a static scheme stores beside each member of a group, from the group's input amax:
    NVFP4's `input_global_scale` (as `generate_gparam(-amax, amax)`), FP8's `input_scale` (amax / 448)."""
    import torch

    from build.quantize.nvfp4 import global_scale

    value = torch.tensor([amax], dtype=torch.float32)
    if scheme_name == "NVFP4":
        return {"input_global_scale": torch.from_numpy(global_scale(value.numpy()))}
    return {"input_scale": value / 448.0}


def group_input_amax(modules: list[str], input_amax: dict[str, float], largest: dict[tuple[str, str], float],
                     scheme: str, report: dict[str, dict]) -> float:
    """The input amax a static group shares (the largest of its members': they share their input). An expert that
    no calibration token reached takes the largest of its layer's experts for the same projection (conservative),
    noted in the report; a module with neither is refused."""
    found = []
    for module in modules:
        prefix, _, rest = module.partition(".experts.")
        borrowed = largest.get((prefix, rest.split(".", 1)[-1])) if rest else None
        if module in input_amax:
            found.append(input_amax[module])
        elif borrowed is not None:
            found.append(borrowed)
            report.setdefault(module, {})["input_scale_from"] = "largest of the layer's experts (not routed)"
        else:
            raise ValueError(f"static scheme {scheme} needs calibrated inputs for {module} (pass --calibration-tasks)")
    return max(found)


def largest_expert_amax(input_amax: dict[str, float]) -> dict[tuple[str, str], float]:
    """(layer's experts prefix, projection) -> the largest calibrated input amax of that layer's experts."""
    largest: dict[tuple[str, str], float] = {}
    for name, value in input_amax.items():
        if ".experts." in name:
            prefix, rest = name.split(".experts.", 1)
            key = (prefix, rest.split(".", 1)[-1])
            largest[key] = max(largest.get(key, 0.0), value)
    return largest


def quantization_config(schemes: dict[str, str], kv_cache: bool, head: tuple[str, ...] = ("lm_head",)):
    """compressed-tensors' QuantizationConfig of the planned modules: one config group per scheme, explicit module
    names as targets (a quantised `lm_head` under each of `head`, the names vLLM's models give it:
    build.quantize.fused.HEAD_TARGETS), `kv_cache_scheme` (FP8 per tensor, static) when KV-cache scales are written.

    Each group names its own format, as compressed-tensors' compressor writes it (`scheme.format`, format.py
    `infer_and_set_per_module_quantization_format`): vLLM takes a layer's format from its group, else the global one
    (compressed_tensors.py `_get_scheme_from_parts`), and "mixed-precision" is no format it builds an FP8 layer for
    (`is_activation_quantization_format`): the dense recipe's NVFP4 + FP8 checkpoint raised NotImplementedError at
    its first FP8 layer without them."""
    from compressed_tensors.quantization import QuantizationArgs, QuantizationConfig

    targets: dict[str, list[str]] = {}
    for module, scheme in schemes.items():
        targets.setdefault(scheme, []).extend(head if module == "lm_head" else [module])
    groups = {f"group_{i}": library_scheme(scheme, sorted(targets[scheme])).model_copy(
        update={"format": FORMATS[scheme]}) for i, scheme in enumerate(s for s in FORMATS if s in targets)}
    formats = {FORMATS[s] for s in targets}
    kv = (QuantizationArgs(num_bits=8, type="float", strategy="tensor", dynamic=False, symmetric=True)
          if kv_cache else None)
    return QuantizationConfig(config_groups=groups, format=formats.pop() if len(formats) == 1 else "mixed-precision",
                              quantization_status="compressed", kv_cache_scheme=kv)


def shard_jobs(weights: dict[str, str], dependencies: dict[str, list[str]]) -> dict[str, list[str]]:
    """Output shard -> the tensors it holds, as compressed-tensors' converter assigns them
    (`build_inverse_weight_maps`): every tensor stays in its shard except the other members of a fused group, which
    go to the shard of its first member (quantised together there). A shard left with no tensor is not written (the
    converter refuses such a checkpoint). Pure, linear in the names."""
    moved = {name for members in dependencies.values() for name in members}
    out: dict[str, list[str]] = {}
    for name, shard in weights.items():
        if name not in moved:
            out.setdefault(shard, []).extend([name, *dependencies.get(name, ())])
    return out


class Shards:
    """The source shards, each header read once and each file memory-mapped once: a tensor is a view of its bytes
    (no torch, no copy)."""

    def __init__(self, files: dict[str, Path], weights: dict[str, str]):
        self.files, self.weights = files, weights
        self.headers = {shard: read_header(files[shard]) for shard in sorted(set(weights.values()))}
        self.maps: dict[str, np.ndarray] = {}

    def info(self, name: str) -> dict:
        return self.headers[self.weights[name]][1][name]

    def release(self) -> None:
        """Unmap every shard (after a shard is written: its pages would otherwise count in the resident memory until
        the end, the whole checkpoint's worth)."""
        self.maps.clear()

    def view(self, name: str) -> tuple[np.ndarray, int]:
        """The tensor's bytes (uint8) and their offset in its shard's map."""
        shard = self.weights[name]
        if shard not in self.maps:
            # copy-on-write: writable views (numba and torch take them), never written; a plain array slices faster
            self.maps[shard] = np.memmap(self.files[shard], dtype=np.uint8, mode="c").view(np.ndarray)
        start, header = self.headers[shard]
        begin, end = header[name]["data_offsets"]
        return self.maps[shard][start + begin:start + end], start + begin

    def tensor(self, name: str) -> "torch.Tensor":
        """A copy as a torch tensor of its own dtype (for the few weights the library quantises)."""
        import torch

        info = self.info(name)
        data = np.array(self.view(name)[0])
        return torch.from_numpy(data).view(getattr(torch, DTYPES[info["dtype"]])).reshape(info["shape"])


def _nvfp4_source(shards: Shards, names: list[str]) -> tuple[np.ndarray, list[int]]:
    """The flat array the NVFP4 loops read the weights from, and each weight's element offset in it: the shard's own
    map seen as bfloat16 bits or float32 when all lie in one shard with that dtype and its alignment (the usual
    case, nothing copied), else a float32 copy of them (members from another shard, float16, mixed dtypes)."""
    infos = [shards.info(name) for name in names]
    dtypes = {info["dtype"] for info in infos}
    shard_names = {shards.weights[name] for name in names}
    if len(shard_names) == 1 and len(dtypes) == 1 and (dtype := dtypes.pop()) in ("BF16", "F32"):
        size = 2 if dtype == "BF16" else 4
        offsets = [shards.view(name)[1] for name in names]
        if all(offset % size == 0 for offset in offsets):
            data = shards.maps[shard_names.pop()]
            usable = len(data) // size * size
            return data[:usable].view(np.uint16 if size == 2 else np.float32), [o // size for o in offsets]
    parts = []
    for name, info in zip(names, infos):
        raw = np.array(shards.view(name)[0])
        if info["dtype"] == "BF16":
            parts.append((raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32))
        elif info["dtype"] in ("F16", "F32"):
            parts.append(raw.view(np.float16 if info["dtype"] == "F16" else np.float32).astype(np.float32))
        else:
            raise ValueError(f"{shards.files[shards.weights[name]]}: {name} has dtype {info['dtype']}, which "
                             "NVFP4 does not quantise (BF16, F16 or F32)")
    starts = np.cumsum([0] + [len(p) for p in parts])[:-1].tolist()
    return np.concatenate(parts), starts


def quantize_shard(shards: Shards, names: list[str], schemes: dict[str, str], group_of: dict[str, str],
                   kv_scales: dict[str, float], input_amax: dict[str, float],
                   largest: dict[tuple[str, str], float], report: dict[str, dict], with_error: bool) -> dict:
    """One output shard's tensors as safetensors specs (name -> (dtype, shape, array)), the same tensors the converter
    writes: passed-through tensors as views of the source map, NVFP4 weights from build.quantize.nvfp4 (all of the
    shard's at once), FP8 and INT weights from the library, KV-cache scales beside each attention layer's k_proj. Fills
    `report`."""
    import torch

    from build.quantize.nvfp4 import quantize as nvfp4

    out: dict[str, tuple[str, list[int], np.ndarray]] = {}

    def put(name: str, tensor: "torch.Tensor") -> None:
        dtype = str(tensor.dtype).removeprefix("torch.")
        out[name] = (dtype, list(tensor.shape), tensor.contiguous().reshape(-1).view(torch.uint8).numpy())

    groups: dict[tuple[str, str], list[str]] = {}
    for name in names:
        if name.endswith(".k_proj.weight"):
            attention = name[:-len(".k_proj.weight")]
            for kind in ("k_scale", "v_scale"):
                if f"{attention}.{kind}" in kv_scales:
                    put(f"{attention}.{kind}", torch.tensor(kv_scales[f"{attention}.{kind}"], dtype=torch.float32))
        info = shards.info(name)
        module = name[:-len(".weight")] if name.endswith(".weight") else None
        scheme = schemes.get(module)
        if scheme is None or len(info["shape"]) != 2:
            if info["dtype"] not in DTYPES:
                raise ValueError(f"{shards.files[shards.weights[name]]}: tensor {name} has dtype {info['dtype']}, "
                                 "which the quantiser does not handle")
            out[name] = (DTYPES[info["dtype"]], info["shape"], shards.view(name)[0])
            continue
        groups.setdefault((group_of.get(module, module), scheme), []).append(module)
    extras = {key: static_input(key[1], group_input_amax(modules, input_amax, largest, key[1], report))
              for key, modules in groups.items() if key[1] in STATIC}
    for (fused, scheme), modules in groups.items():
        if not scheme.startswith("NVFP4"):  # FP8 and INT: the library's own calls, module by module
            loaded = {m: shards.tensor(f"{m}.weight") for m in modules}
            state = (fp8_weights(loaded, scheme, extras.get((fused, scheme))) if scheme.startswith("FP8")
                     else int_weights(loaded, scheme))
            for k, v in state.items():
                put(k, v)
            for module in modules:
                row = report.setdefault(module, {})
                row["scheme"] = scheme
                if with_error:
                    original = loaded[module].to(torch.float32)
                    restored = dequantize(state, module, scheme).to(torch.float32)
                    row["relative_error"] = float((restored - original).norm() / original.norm().clamp(min=1e-12))
    members = [(key, m) for key, modules in groups.items() if key[1].startswith("NVFP4") for m in modules]
    if not members:
        return out
    weights = [f"{m}.weight" for _, m in members]
    source, starts = _nvfp4_source(shards, weights)
    shapes = [shards.info(w)["shape"] for w in weights]
    group_ids = {key: i for i, key in enumerate(dict.fromkeys(key for key, _ in members))}
    q = nvfp4(source, starts, [s[0] for s in shapes], [s[1] for s in shapes], [group_ids[k] for k, _ in members],
              weights, with_error)
    for i, ((key, module), (rows, cols)) in enumerate(zip(members, shapes)):
        at, blocks = int(q.scales_at[i]), rows * cols // 16
        out[f"{module}.weight_packed"] = ("uint8", [rows, cols // 2], q.packed[at * 8:at * 8 + blocks * 8])
        out[f"{module}.weight_scale"] = ("float8_e4m3fn", [rows, cols // 16], q.scales[at:at + blocks])
        out[f"{module}.weight_global_scale"] = ("float32", [1], q.global_scales[i:i + 1])
        for k, v in extras.get(key, {}).items():
            put(f"{module}.{k}", v.clone())
        row = report.setdefault(module, {})
        row["scheme"] = key[1]
        if q.errors is not None:
            row["relative_error"] = float(np.sqrt(q.errors[i, 0]) / max(np.sqrt(q.errors[i, 1]), 1e-12))
    return out


def report_json(report: dict) -> str:
    """The report as JSON, one tensor a line (json's indenting encoder is pure Python: ~1 s for the 80B's 43k rows,
    the C encoder writes each line). Pure."""
    lines = [f" {json.dumps(key)}: {json.dumps(value)}" for key, value in report.items() if key != "tensors"]
    rows = ",\n".join(f"  {json.dumps(module)}: {json.dumps(row)}" for module, row in report["tensors"].items())
    return "{\n" + ",\n".join(lines) + ',\n "tensors": {\n' + rows + "\n }\n}\n"


class _Config:
    """What compressed-tensors' config writer asks of a converter: the new quantization config, the model config."""

    def __init__(self, config):
        self.config = config

    def update_config(self, _existing):
        return self.config

    def update_model_config(self, model_config: dict) -> dict:
        return model_config


def quantize(model: str | Path, recipe_path: str | Path, out: str | Path,
             kv_scales: dict[str, float] | None = None, input_amax: dict[str, float] | None = None,
             report: bool = True, on_shard=None) -> dict[str, dict]:
    """Quantise `model` by the recipe into `out` (written to `OUT.partial`, renamed when complete); returns the
    per-module report (scheme, and with `report` the relative error of the dequantised weight). `on_shard(done,
    total)` after each shard is written. Runs on the CPU: bound by reading and writing the bytes, so an accelerator
    would not shorten it (benchmarks/RESULTS.md, "Quantising against copying")."""
    from compressed_tensors.entrypoints.convert.convert_file import write_checkpoint_quantization_config
    from compressed_tensors.utils.safetensors_load import update_safetensors_index
    from safetensors import TensorSpec, serialize_file

    from build.quantize.fused import HEAD_TARGETS, groups, model_type, table_for

    model, out = Path(model), Path(out)
    if out.exists():
        raise ValueError(f"{out}: already exists; refusing to overwrite")
    recipe = load_recipe(recipe_path)
    files = checkpoint_files(model)
    weights = weight_map(files)
    config = json.loads((model / "config.json").read_text())
    if "quantization_config" in config:
        raise ValueError(f"{model}/config.json: quantization_config is set: quantise the unquantised checkpoint")
    shards = Shards(files, weights)
    table = table_for(config)
    schemes = plan(recipe, {name: tuple(shards.info(name)["shape"]) for name in weights}, config, str(model))
    fused = groups(schemes, table)
    group_of = {member: name for name, members in fused.items() for member in members}
    # the group's first member is the primary that brings the others along, as in the converter
    dependencies = {f"{members[0]}.weight": [f"{m}.weight" for m in members[1:]] for members in fused.values()}
    jobs = shard_jobs(weights, dependencies)
    partial = out.with_name(out.name + ".partial")
    if partial.exists():
        shutil.rmtree(partial)
    partial.mkdir(parents=True)
    copy_other_files(files, partial)
    rows: dict[str, dict] = {}
    largest = largest_expert_amax(input_amax or {})
    total, new_map = 0, {}
    for done, (shard, names) in enumerate(jobs.items(), 1):
        specs = quantize_shard(shards, names, schemes, group_of, kv_scales or {}, input_amax or {}, largest, rows,
                               report)
        (partial / shard).parent.mkdir(parents=True, exist_ok=True)
        serialize_file({name: TensorSpec(dtype=dtype, shape=shape, data_ptr=data.ctypes.data, data_len=data.nbytes)
                        for name, (dtype, shape, data) in specs.items()}, str(partial / shard), metadata=None)
        total += sum(data.nbytes for _, _, data in specs.values())
        new_map.update(dict.fromkeys(specs, Path(shard).name))
        del specs
        shards.release()
        if on_shard is not None:
            on_shard(done, len(jobs))
    head = HEAD_TARGETS.get(model_type(config), ("lm_head",))
    write_checkpoint_quantization_config(str(partial), [_Config(quantization_config(schemes, bool(kv_scales), head))])
    update_safetensors_index(str(partial), total, new_map)
    (partial / "quantization_report.json").write_text(report_json(
        {"recipe": recipe.name, "recipe_file": str(Path(recipe_path).resolve()), "tensors": rows,
         "kv_scales": kv_scales or {}}))
    partial.rename(out)
    return rows


def calibrated_scales(model: str | Path, recipe_path: str | Path, tasks, samples: int, on_step=None
                      ) -> tuple[dict[str, float], dict[str, float] | None]:
    """FP8 KV-cache scales, and the static input amax if the recipe has a static scheme, from the solver's prompts of
    up to `samples` tasks, in one layer-by-layer pass (build.quantize.activations: one decoder layer resident)."""
    static = any(rule.scheme in STATIC for rule in load_recipe(recipe_path).rules)
    found = activation_amax(model, calibration_prompts(model, tasks, samples), inputs=static, on_step=on_step)
    return kv_cache_scales(found.kv), found.inputs if static else None


def dequantize_checkpoint(model: str | Path, out: str | Path) -> Path:
    """A quantised checkpoint back to BF16 safetensors (compressed-tensors' dequantizer, streamed): what transformers
    loads where no kernel exists (the likelihood check, CPU tests)."""
    import torch
    from compressed_tensors.entrypoints.convert import convert_checkpoint
    from compressed_tensors.entrypoints.convert.converters.ct_dequantizer import CompressedTensorsDequantizer

    convert_checkpoint(str(model), str(out), converter=CompressedTensorsDequantizer(str(model), dtype=torch.bfloat16),
                       max_workers=1, device="cpu")
    return Path(out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m build.quantize", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--recipe", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--calibration-tasks", type=Path,
                        help="ARC tasks whose solver prompts calibrate FP8 KV-cache and static input scales")
    parser.add_argument("--samples", type=int, default=256, help="calibration prompts (one per task)")
    parser.add_argument("--no-report", action="store_true",
                        help="skip the per-tensor error report (its sums in the NVFP4 loop, a dequantisation per FP8 tensor)")
    args = parser.parse_args(argv)
    show_library_logs_from("INFO")
    try:
        from submission.progress import ProgressLine

        kv = amax = None
        if args.calibration_tasks:
            from submission.tasks import load_tasks

            line = ProgressLine()
            try:
                kv, amax = calibrated_scales(args.model, args.recipe, load_tasks(args.calibration_tasks).tasks,
                                             args.samples, lambda s: line.update(
                                                 f"calibrating scales: chunk {s.chunk + 1}, layer {s.layer + 1}"))
            finally:
                line.close()
        line = ProgressLine()
        try:
            report = quantize(args.model, args.recipe, args.out, kv, amax, not args.no_report,
                              lambda done, total: line.update(f"quantise: shard {done}/{total}", final=done == total))
        finally:
            line.close()
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    by_scheme: dict[str, list[float]] = {}
    for row in report.values():
        by_scheme.setdefault(row["scheme"], []).append(row.get("relative_error"))
    for scheme, errors in by_scheme.items():
        measured = [e for e in errors if e is not None]
        print(f"{scheme:12s} {len(errors):5d} tensors" + (f", relative error mean {sum(measured) / len(measured):.4f}, "
                                                         f"max {max(measured):.4f}" if measured else ""))
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
