"""Quantise a checkpoint by a recipe (TOML), shard by shard, into the compressed-tensors format vLLM loads.

    python -m build.quantize --model DIR --recipe build/recipes/moe-4xL4.toml --out DIR

A recipe is data: ordered rules from a module-name pattern (a regex on names such as `model.layers.3.mlp.experts.7.
up_proj`, optionally limited to a layer range) to a scheme; the first matching rule wins and unmatched modules stay
as they are (BF16). Schemes: `NVFP4A16` (E2M1 weights, FP8 E4M3 scale per 16, FP32 global scale; weight-only FP4
kernels on the L4), `NVFP4` (W4A4: the same weights and a calibrated input global scale), `FP8_DYNAMIC` (FP8 weights
per channel, dynamic per-token activations), `FP8` (per-tensor FP8 weights and a calibrated static input scale),
`BF16` (keep). Static schemes need `--calibration-tasks` (build.input_scales).

Weights are upcast to fp32 before quantising (bf16 division flips ~0.5% of the nibbles). Fused projections share one
global scale, since vLLM reads only the first: a layer's q/k/v, and each expert's gate/up (the converter loads them
together). The quantisation itself is compressed-tensors' own (`calculate_qparams`, `generate_gparam`, the NVFP4 and
FP8 compressors), so the tensors are the library's byte for byte. The `quantization_config` written into config.json
is compressed-tensors' (one config group per scheme, explicit module names as targets). A per-tensor report
(`quantization_report.json`: scheme, relative error of the dequantised weight) comes with the output.
With `--calibration-tasks`, FP8 KV-cache scales calibrated on the solver's own prompts of those tasks
(build.kv_scales) are added too, with the `kv_cache_scheme` vLLM reads.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

SCHEMES = ("NVFP4A16", "NVFP4", "FP8_DYNAMIC", "FP8", "BF16")
FORMATS = {"NVFP4A16": "nvfp4-pack-quantized", "NVFP4": "nvfp4-pack-quantized", "FP8_DYNAMIC": "float-quantized",
           "FP8": "float-quantized"}
STATIC = ("NVFP4", "FP8")  # schemes whose activation scales are calibrated (build.input_scales)
FUSED = (re.compile(r"^(.*\.self_attn)\.(q|k|v)_proj$"), re.compile(r"^(.*\.experts\.\d+)\.(gate|up)_proj$"))


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
        layer = re.search(r"\.layers\.(\d+)\.", module)
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


def fused_group(module: str) -> str | None:
    for pattern in FUSED:
        if m := pattern.match(module):
            return m.group(1)
    return None


def _scheme(name: str, targets: list[str]):
    from compressed_tensors.quantization import preset_name_to_scheme

    return preset_name_to_scheme(name, targets)


def quantize_weights(weights: dict[str, "torch.Tensor"], scheme_name: str,
                     input_amax: dict[str, float] | None = None) -> dict[str, "torch.Tensor"]:
    """Quantise the weights of one fused group (or one module) with one scheme. Keys are module names; returns the
    compressed tensors keyed by full tensor name. Static schemes take each module's calibrated input amax (a fused
    group shares the largest, as it shares its input). Pure (no I/O)."""
    import torch
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

    scheme = _scheme(scheme_name, list(weights))
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
    return compressor.decompress(local, _scheme(scheme_name, [module]))["weight"]


class RecipeQuantizer:
    """A compressed-tensors converter that applies a recipe to every Linear weight it is handed, and adds the FP8
    KV-cache scales (`kv_scales`: tensor name -> scale) to the shard holding each attention layer's k_proj."""

    def __init__(self, recipe: Recipe, weight_names: set[str], kv_scales: dict[str, float] | None = None,
                 input_amax: dict[str, float] | None = None):
        self.recipe = recipe
        self.names = weight_names
        self.kv_scales = kv_scales or {}
        self.input_amax = input_amax or {}
        self.targets: dict[str, list[str]] = {s: [] for s in FORMATS}
        self.report: dict[str, dict] = {}

    def _module(self, tensor_name: str) -> str | None:
        return tensor_name[:-len(".weight")] if tensor_name.endswith(".weight") else None

    def _quantisable(self, tensor_name: str, tensor) -> str | None:
        module = self._module(tensor_name)
        if module is None or tensor.ndim != 2 or module.endswith("mlp.gate") or "embed" in module:
            return None
        scheme = self.recipe.scheme_for(module)
        return scheme if scheme in FORMATS else None

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
            scheme = self._quantisable(name, tensor)
            if scheme is None:
                out[name] = tensor
                continue
            module = self._module(name)
            key = (fused_group(module) or module, scheme)
            groups.setdefault(key, {})[module] = tensor
        for (_, scheme), weights in groups.items():
            packed = quantize_weights(weights, scheme, self._amax_for(weights) if scheme in STATIC else None)
            out.update(packed)
            if tensors and next(iter(weights.values())).device.type != "meta":
                for module, w in weights.items():
                    restored = dequantize(packed, module, scheme).to(torch.float32)
                    original = w.to(torch.float32)
                    self.report.setdefault(module, {}).update({"scheme": scheme, "relative_error": float(
                        (restored - original).norm() / original.norm().clamp(min=1e-12))})
                    if module not in self.targets[scheme]:
                        self.targets[scheme].append(module)
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
            projection = rest.split(".", 1)[1]
            values = [v for name, v in self.input_amax.items()
                      if name.startswith(prefix + ".experts.") and name.endswith("." + projection)]
            if values:
                out[module] = max(values)
                self.report.setdefault(module, {})["input_scale_from"] = "largest of the layer's experts (not routed)"
        return out

    def validate(self, tensors: dict) -> dict:
        return {name: t for name, t in tensors.items()}  # quantising meta tensors is not possible; names suffice

    def get_dependencies(self, weight_name: str) -> set[str]:
        """The other members of a fused group, so that they are quantised together (one global scale)."""
        module = self._module(weight_name)
        group = fused_group(module) if module else None
        if group is None:
            return set()
        members = sorted(n for n in self.names if n.endswith(".weight") and fused_group(n[:-len(".weight")]) == group)
        # the group's first member is the primary that brings the others along (dependencies must not be mutual)
        return set(members[1:]) if weight_name == members[0] else set()

    def update_config(self, config):
        from compressed_tensors.quantization import QuantizationConfig

        groups = {f"group_{i}": _scheme(scheme, sorted(modules))
                  for i, (scheme, modules) in enumerate(self.targets.items()) if modules}
        formats = {FORMATS[s] for s, modules in self.targets.items() if modules}
        kv = None
        if self.kv_scales:
            from compressed_tensors.quantization import QuantizationArgs

            kv = QuantizationArgs(num_bits=8, type="float", strategy="tensor", dynamic=False, symmetric=True)
        return QuantizationConfig(config_groups=groups, format=formats.pop() if len(formats) == 1 else "mixed-precision",
                                  quantization_status="compressed", kv_cache_scheme=kv)

    def update_model_config(self, model_config: dict) -> dict:
        return model_config


def quantize(model: str | Path, recipe_path: str | Path, out: str | Path,
             kv_scales: dict[str, float] | None = None, input_amax: dict[str, float] | None = None) -> dict[str, dict]:
    from compressed_tensors.entrypoints.convert import convert_checkpoint
    from compressed_tensors.utils.safetensors_load import get_checkpoint_files, get_weight_map

    model, out = Path(model), Path(out)
    if out.exists():
        raise ValueError(f"{out}: already exists; refusing to overwrite")
    recipe = load_recipe(recipe_path)
    names = set(get_weight_map(get_checkpoint_files(str(model))))
    quantizer = RecipeQuantizer(recipe, names, kv_scales, input_amax)
    partial = out.with_name(out.name + ".partial")
    convert_checkpoint(str(model), str(partial), converter=quantizer, max_workers=1, device="cpu")
    (partial / "quantization_report.json").write_text(json.dumps(
        {"recipe": recipe.name, "recipe_file": str(Path(recipe_path).resolve()), "tensors": quantizer.report,
         "kv_scales": kv_scales or {}},
        indent=1))
    partial.rename(out)
    return quantizer.report


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
    args = parser.parse_args(argv)
    try:
        kv = amax = None
        if args.calibration_tasks:
            from build.input_scales import input_amax
            from build.kv_scales import calibration_prompts, kv_amax, scales
            from submission.tasks import load_tasks

            prompts = calibration_prompts(args.model, load_tasks(args.calibration_tasks).tasks, args.samples)
            kv = scales(kv_amax(args.model, prompts))
            amax = input_amax(args.model, prompts)
        report = quantize(args.model, args.recipe, args.out, kv, amax)
    except ValueError as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    by_scheme: dict[str, list[float]] = {}
    for row in report.values():
        by_scheme.setdefault(row["scheme"], []).append(row["relative_error"])
    for scheme, errors in by_scheme.items():
        print(f"{scheme:12s} {len(errors):5d} tensors, relative error mean {sum(errors) / len(errors):.4f}, "
              f"max {max(errors):.4f}")
    print(args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
