"""Quantise a checkpoint by a recipe (TOML), shard by shard, into the compressed-tensors format vLLM loads.

    python -m build.quantize --model DIR --recipe build/recipes/moe-4xL4.toml --out DIR

A recipe is data: ordered rules from a module-name pattern (a regex on names such as `model.layers.3.mlp.experts.7.
up_proj`, optionally limited to a layer range) to a scheme; the first matching rule wins and unmatched modules stay
as they are (BF16). Schemes: `NVFP4A16` (E2M1 weights, FP8 E4M3 scale per 16, FP32 global scale; weight-only FP4
kernels on the L4), `NVFP4` (W4A4: the same weights and a calibrated input global scale), `FP8_DYNAMIC` (FP8 weights
per channel, dynamic per-token activations), `FP8` (per-tensor FP8 weights and a calibrated static input scale),
`BF16` (keep). Static schemes need `--calibration-tasks` (build.input_scales).

Weights are upcast to fp32 before quantising (bf16 division flips ~0.5% of the nibbles). Every set of weights vLLM
fuses into one linear shares one global scale (and one static input scale), since vLLM keeps only the first: the
groups come from one table per architecture (build.fused: q/k/v, gate/up of dense MLPs, of each routed expert and of
shared experts), found in one pass over the names so the converter's per-tensor dependency lookups cost O(1); a
recipe giving a group's members different schemes, or quantising nothing, is refused before any work.
MTP layers (`mtp.*`, Qwen3-Next) are matched by the same rules as the decoder layers except layer-ranged ones (the
MTP layer is none of layers 0..N-1), as vLLM 0.33 looks them up: its MTP decoder layer and `mtp.fc` are built with
the checkpoint's quantization config under their checkpoint names (experts by expert 0's names), while its output
head is built without one, so a recipe that quantises `lm_head` is refused for a checkpoint with MTP weights.
The quantisation itself is compressed-tensors' own (`calculate_qparams`, `generate_gparam`, the NVFP4 and FP8
compressors), so the tensors are the library's byte for byte. The `quantization_config` written into config.json
is compressed-tensors' (one config group per scheme, explicit module names as targets). A per-tensor report
(`quantization_report.json`: scheme, relative error of the dequantised weight) comes with the output.
With `--calibration-tasks`, FP8 KV-cache scales calibrated on the solver's own prompts of those tasks
(build.kv_scales) are added too, with the `kv_cache_scheme` vLLM reads; they and the static input scales (observed
only when the recipe has a static scheme) come from one layer-by-layer pass over the prompts (build.input_scales:
one decoder layer resident, never the whole model).
"""

from __future__ import annotations

import argparse
import functools
import json
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from build.library_logs import show_library_logs_from

if TYPE_CHECKING:
    import torch

SCHEMES = ("NVFP4A16", "NVFP4", "FP8_DYNAMIC", "FP8", "BF16")
FORMATS = {"NVFP4A16": "nvfp4-pack-quantized", "NVFP4": "nvfp4-pack-quantized", "FP8_DYNAMIC": "float-quantized",
           "FP8": "float-quantized"}
STATIC = ("NVFP4", "FP8")  # schemes whose activation scales are calibrated (build.input_scales)
LAYER = re.compile(r"\.layers\.(\d+)\.")


@dataclass(frozen=True)
class Rule:
    pattern: str
    scheme: str
    layers: tuple[int, int] | None = None


@dataclass(frozen=True)
class Recipe:
    name: str
    rules: tuple[Rule, ...]
    max_nll_increase: float = 0.02  # the likelihood check's threshold (build.check_quality)

    def scheme_for(self, module: str) -> str:
        layer = None if module.startswith("mtp.") else LAYER.search(module)  # the MTP layer is none of 0..N-1
        for rule in self.rules:
            if rule.layers is not None and (layer is None or not
                                            rule.layers[0] <= int(layer.group(1)) <= rule.layers[1]):
                continue
            if re.search(rule.pattern, module):
                return rule.scheme
        return "BF16"


def load_recipe(path: str | Path) -> Recipe:
    path = Path(path)
    try:
        raw = tomllib.loads(path.read_text())
    except (OSError, tomllib.TOMLDecodeError) as err:
        raise ValueError(f"{path}: cannot read the recipe: {err}") from None
    rules = []
    for number, rule in enumerate(raw.get("rules", [])):
        unknown = sorted(set(rule) - {"pattern", "scheme", "layers"})
        if unknown or "pattern" not in rule or rule.get("scheme") not in SCHEMES:
            raise ValueError(f"{path}: rules[{number}]: needs pattern and scheme in {SCHEMES}"
                             + (f"; unknown keys {unknown}" if unknown else ""))
        try:
            re.compile(rule["pattern"])
        except re.error as err:
            raise ValueError(f"{path}: rules[{number}].pattern: {err}") from None
        layers = tuple(rule["layers"]) if "layers" in rule else None
        rules.append(Rule(rule["pattern"], rule["scheme"], layers))
    unknown = sorted(set(raw) - {"name", "rules", "check"})
    if unknown:
        raise ValueError(f"{path}: unknown key(s) {unknown}")
    return Recipe(raw.get("name", path.stem), tuple(rules), raw.get("check", {}).get("max_nll_increase", 0.02))


def _scheme(name: str, targets: list[str]):
    from compressed_tensors.quantization import preset_name_to_scheme

    return preset_name_to_scheme(name, targets)


@functools.cache
def _compression_scheme(name: str):
    """The scheme the compressors are handed: its targets play no part there, so one object per scheme name serves
    every tensor (building one per call cost ~10% of quantising a tiny-width checkpoint)."""
    return _scheme(name, ["Linear"])


def plan(recipe: Recipe, tensors: dict[str, tuple[int, ...]], table: dict[str, tuple[str, ...]],
         source: str = "checkpoint") -> dict[str, str]:
    """Module -> scheme for every weight the recipe quantises (tensor name -> shape, from the shard headers), refusing
    what vLLM could not load or what would be a silent no-op: nothing matched, a fused group split over schemes, a
    quantised `lm_head` beside MTP weights. Pure; one pass over the names."""
    from build.fused import groups

    candidates = {}
    for name, shape in tensors.items():
        module = name[:-len(".weight")]
        if name.endswith(".weight") and len(shape) == 2 and not module.endswith("mlp.gate") and "embed" not in module:
            candidates[module] = recipe.scheme_for(module)
    schemes = {module: scheme for module, scheme in candidates.items() if scheme in FORMATS}
    if not schemes:
        raise ValueError(f"recipe {recipe.name!r}: its patterns {[r.pattern for r in recipe.rules]} match no "
                         f"quantisable weight of {source}")
    for fused, members in groups(candidates, table).items():
        split = {module: candidates[module] for module in members}
        if len(set(split.values())) > 1:
            raise ValueError(f"recipe {recipe.name!r}: {fused} is one linear in vLLM but its parts get different "
                             f"schemes {split}")
    if "lm_head" in schemes and any(name.startswith("mtp.") for name in tensors):
        raise ValueError(f"recipe {recipe.name!r} quantises lm_head, but {source} has MTP weights: vLLM 0.33's "
                         "Qwen3-Next MTP builds its output head without a quantization config (qwen3_next_mtp.py)")
    return schemes


def quantize_weights(weights: dict[str, "torch.Tensor"], scheme_name: str,
                     input_amax: dict[str, float] | None = None) -> dict[str, "torch.Tensor"]:
    """Quantise the weights of one fused group (or one module) with one scheme. Keys are module names; returns the
    compressed tensors keyed by full tensor name. Static schemes take each module's calibrated input amax (a fused
    group shares the largest, as it shares its input). Pure (no I/O)."""
    import torch
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

    scheme = _compression_scheme(scheme_name)
    args = scheme.weights
    out = {}
    upcast = {name: w.to(torch.float32) for name, w in weights.items()}
    extra: dict[str, torch.Tensor] = {}
    if scheme_name in STATIC:
        missing = [name for name in weights if name not in (input_amax or {})]
        if missing:
            raise ValueError(f"static scheme {scheme_name} needs calibrated inputs for {missing[:3]} "
                             "(pass --calibration-tasks)")
        amax = torch.tensor([max(input_amax[name] for name in weights)], dtype=torch.float32)
        extra = ({"input_global_scale": generate_gparam(-amax, amax)} if scheme_name == "NVFP4"
                 else {"input_scale": amax / 448.0})
    if scheme_name in ("NVFP4A16", "NVFP4"):
        low = torch.stack([w.min() for w in upcast.values()]).min()
        high = torch.stack([w.max() for w in upcast.values()]).max()
        global_scale = generate_gparam(low.reshape(1), high.reshape(1))  # shared across the fused group
        for name, w in upcast.items():
            groups = w.reshape(w.shape[0], -1, args.group_size)
            scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), args, global_scale=global_scale)
            state = NVFP4PackedCompressor.compress(  # each member stores its own copy of the shared global scale
                {"weight": w, "weight_scale": scale, "weight_global_scale": global_scale.clone()}, scheme)
            out.update({f"{name}.{k}": v for k, v in state.items()})
            out.update({f"{name}.{k}": v.clone() for k, v in extra.items()})
    elif scheme_name in ("FP8_DYNAMIC", "FP8"):
        for name, w in upcast.items():
            if scheme_name == "FP8":  # per tensor
                scale, _ = calculate_qparams(w.min().reshape(1), w.max().reshape(1), args)
            else:  # per output channel
                scale, _ = calculate_qparams(w.amin(1, keepdim=True), w.amax(1, keepdim=True), args)
            state = FloatQuantizationCompressor.compress({"weight": w, "weight_scale": scale}, scheme)
            out.update({f"{name}.{k}": v for k, v in state.items()})
            out.update({f"{name}.{k}": v.clone() for k, v in extra.items()})
    else:
        raise ValueError(f"not a quantising scheme: {scheme_name}")
    return out


def dequantize(state: dict[str, "torch.Tensor"], module: str, scheme_name: str) -> "torch.Tensor":
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor

    local = {k[len(module) + 1:]: v for k, v in state.items() if k.startswith(module + ".")}
    compressor = NVFP4PackedCompressor if scheme_name.startswith("NVFP4") else FloatQuantizationCompressor
    return compressor.decompress(local, _compression_scheme(scheme_name))["weight"]


class RecipeQuantizer:
    """A compressed-tensors converter that quantises each planned module (`schemes`: module -> scheme, from `plan`)
    with its fused group, and adds the FP8 KV-cache scales (`kv_scales`: tensor name -> scale) to the shard holding
    each attention layer's k_proj. The groups are indexed once here: the converter asks `get_dependencies` of every
    tensor, and a scan of all names per call made that quadratic (3 hours of set-up for an 80B MoE's 75k tensors)."""

    def __init__(self, schemes: dict[str, str], table: dict[str, tuple[str, ...]],
                 kv_scales: dict[str, float] | None = None, input_amax: dict[str, float] | None = None,
                 report: bool = True):
        from build.fused import groups

        self.schemes = schemes
        self.table = table
        self.kv_scales = kv_scales or {}
        self.input_amax = input_amax or {}
        self.with_report = report
        self.report: dict[str, dict] = {}
        self.largest: dict[tuple[str, str], float] = {}  # (layer's experts prefix, projection) -> largest amax
        for name, value in self.input_amax.items():
            if ".experts." in name:
                prefix, rest = name.split(".experts.", 1)
                key = (prefix, rest.split(".", 1)[-1])
                self.largest[key] = max(self.largest.get(key, 0.0), value)
        self.group_of: dict[str, str] = {}
        self.dependencies: dict[str, set[str]] = {}
        for fused, members in groups(schemes, table).items():
            # the group's first member is the primary that brings the others along (dependencies must not be mutual)
            self.dependencies[f"{members[0]}.weight"] = {f"{m}.weight" for m in members[1:]}
            self.group_of.update({m: fused for m in members})

    def process(self, tensors: dict) -> dict:
        import torch

        out, groups = {}, {}
        for name in tensors:
            if name.endswith(".k_proj.weight"):
                attention = name[:-len(".k_proj.weight")]
                for kind in ("k_scale", "v_scale"):
                    if f"{attention}.{kind}" in self.kv_scales:
                        out[f"{attention}.{kind}"] = torch.tensor(self.kv_scales[f"{attention}.{kind}"],
                                                                  dtype=torch.float32)
        for name, tensor in tensors.items():
            module = name[:-len(".weight")] if name.endswith(".weight") else None
            scheme = self.schemes.get(module)
            if scheme is None or tensor.ndim != 2:
                out[name] = tensor
                continue
            groups.setdefault((self.group_of.get(module, module), scheme), {})[module] = tensor
        for (_, scheme), weights in groups.items():
            packed = quantize_weights(weights, scheme, self._amax_for(weights) if scheme in STATIC else None)
            out.update(packed)
            if next(iter(weights.values())).device.type == "meta":
                continue
            for module, w in weights.items():
                row = self.report.setdefault(module, {})
                row["scheme"] = scheme
                if self.with_report:
                    restored = dequantize(packed, module, scheme).to(torch.float32)
                    original = w.to(torch.float32)
                    row["relative_error"] = float((restored - original).norm() / original.norm().clamp(min=1e-12))
        return out

    def _amax_for(self, weights: dict) -> dict[str, float]:
        """Calibrated input amax per module; an expert no calibration token was routed to takes the largest of its
        layer's experts for the same projection (conservative), noted in the report."""
        out = {}
        for module in weights:
            if module in self.input_amax:
                out[module] = self.input_amax[module]
                continue
            if ".experts." not in module:
                continue
            prefix, rest = module.split(".experts.", 1)
            largest = self.largest.get((prefix, rest.split(".", 1)[-1]))
            if largest is not None:
                out[module] = largest
                self.report.setdefault(module, {})["input_scale_from"] = "largest of the layer's experts (not routed)"
        return out

    def validate(self, tensors: dict) -> dict:
        return {name: t for name, t in tensors.items()}  # quantising meta tensors is not possible; names suffice

    def get_dependencies(self, weight_name: str) -> set[str]:
        """The other members of a fused group, so that they are quantised together (one global scale); O(1)."""
        return self.dependencies.get(weight_name, set())

    def update_config(self, config):
        from compressed_tensors.quantization import QuantizationConfig

        targets: dict[str, list[str]] = {}
        for module, scheme in self.schemes.items():
            targets.setdefault(scheme, []).append(module)
        groups = {f"group_{i}": _scheme(scheme, sorted(targets[scheme]))
                  for i, scheme in enumerate(s for s in FORMATS if s in targets)}
        formats = {FORMATS[s] for s in targets}
        kv = None
        if self.kv_scales:
            from compressed_tensors.quantization import QuantizationArgs

            kv = QuantizationArgs(num_bits=8, type="float", strategy="tensor", dynamic=False, symmetric=True)
        return QuantizationConfig(config_groups=groups, format=formats.pop() if len(formats) == 1 else "mixed-precision",
                                  quantization_status="compressed", kv_cache_scheme=kv)

    def update_model_config(self, model_config: dict) -> dict:
        return model_config


def tensor_shapes(files: list[str]) -> dict[str, tuple[int, ...]]:
    """Tensor name -> shape from the shards' headers (no tensor is read)."""
    from safetensors import safe_open

    shapes = {}
    for file in files:
        with safe_open(file, framework="pt") as f:
            shapes.update({name: tuple(f.get_slice(name).get_shape()) for name in f.keys()})
    return shapes


def quantize(model: str | Path, recipe_path: str | Path, out: str | Path,
             kv_scales: dict[str, float] | None = None, input_amax: dict[str, float] | None = None,
             report: bool = True, device: str = "auto") -> dict[str, dict]:
    """Quantise `model` by the recipe into `out`; returns the per-module report (scheme, and with `report` the
    relative error of the dequantised weight: one decompression per tensor, ~15% of the time).

    `device`: where the shards are quantised: "auto" (every accelerator torch sees, else the CPU: compressed-tensors'
    own choice), "cpu", or a torch device such as "cuda:0". On a CUDA device compressed-tensors runs its Triton
    kernels for the FP4 cast and packing; on the CPU its element-wise fallback is ~90% of the time at real widths
    and runs at ~10 M elements/s on one core (benchmarks/RESULTS.md, "Quantising against copying")."""
    from compressed_tensors.entrypoints.convert import convert_checkpoint
    from compressed_tensors.utils.safetensors_load import get_checkpoint_files

    from build.fused import table_for

    model, out = Path(model), Path(out)
    if out.exists():
        raise ValueError(f"{out}: already exists; refusing to overwrite")
    recipe = load_recipe(recipe_path)
    config = json.loads((model / "config.json").read_text())
    files = [path for name, path in get_checkpoint_files(str(model)).items() if name.endswith(".safetensors")]
    schemes = plan(recipe, tensor_shapes(files), table_for(config), str(model))
    quantizer = RecipeQuantizer(schemes, table_for(config), kv_scales, input_amax, report)
    partial = out.with_name(out.name + ".partial")
    convert_checkpoint(str(model), str(partial), converter=quantizer, max_workers=1,
                       device=None if device == "auto" else device)
    (partial / "quantization_report.json").write_text(json.dumps(
        {"recipe": recipe.name, "recipe_file": str(Path(recipe_path).resolve()), "tensors": quantizer.report,
         "kv_scales": kv_scales or {}},
        indent=1))
    partial.rename(out)
    return quantizer.report


def calibrated_scales(model: str | Path, recipe_path: str | Path, tasks, samples: int, on_step=None
                      ) -> tuple[dict[str, float], dict[str, float] | None]:
    """FP8 KV-cache scales, and the static input amax if the recipe has a static scheme, from the solver's prompts of
    up to `samples` tasks, in one layer-by-layer pass (build.input_scales: one decoder layer resident)."""
    from build.input_scales import activation_amax
    from build.kv_scales import calibration_prompts, scales

    static = any(rule.scheme in STATIC for rule in load_recipe(recipe_path).rules)
    found = activation_amax(model, calibration_prompts(model, tasks, samples), inputs=static, on_step=on_step)
    return scales(found.kv), found.inputs if static else None


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
                        help="skip the per-tensor error report (a dequantisation per tensor, ~15%% of the time)")
    parser.add_argument("--device", default="auto",
                        help="auto (the accelerators torch sees, else the CPU), cpu, or a torch device like cuda:0: "
                             "on CUDA compressed-tensors quantises with its Triton kernels")
    args = parser.parse_args(argv)
    show_library_logs_from("INFO")
    try:
        kv = amax = None
        if args.calibration_tasks:
            from submission.progress import ProgressLine
            from submission.tasks import load_tasks

            line = ProgressLine()
            try:
                kv, amax = calibrated_scales(args.model, args.recipe, load_tasks(args.calibration_tasks).tasks,
                                             args.samples, lambda s: line.update(
                                                 f"calibrating scales: chunk {s.chunk + 1}, layer {s.layer + 1}"))
            finally:
                line.close()
        report = quantize(args.model, args.recipe, args.out, kv, amax, not args.no_report, args.device)
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
