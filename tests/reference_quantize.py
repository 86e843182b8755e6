"""The quantiser as compressed-tensors itself runs it, the reference build.quantize's output is compared with byte
for byte: the library's streaming converter (`convert_checkpoint`) driving a converter that quantises each fused
group with the library's own calls (`generate_gparam`, `calculate_qparams`, `NVFP4PackedCompressor`,
`FloatQuantizationCompressor`, `PackedQuantizationCompressor`) tensor by tensor, with its CPU fallbacks for the FP4
cast and packing. This was build.quantize itself until its NVFP4 arithmetic moved into compiled loops
(build/quantize/nvfp4.py): ~10 M elements/s here.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from build.quantize.quantizer import load_recipe, plan
from build.schemes import FORMATS, STATIC, compression_scheme, dequantize, library_scheme


def quantize_weights(weights: dict[str, "torch.Tensor"], scheme_name: str,
                     input_amax: dict[str, float] | None = None) -> dict[str, "torch.Tensor"]:
    """Quantise the weights of one fused group (or one module) with one scheme. Keys are module names; returns the
    compressed tensors keyed by full tensor name. Static schemes take each module's calibrated input amax (a fused
    group shares the largest, as it shares its input). Pure (no I/O)."""
    from compressed_tensors.compressors.naive_quantized.base import FloatQuantizationCompressor
    from compressed_tensors.compressors.nvfp4.base import NVFP4PackedCompressor
    from compressed_tensors.quantization.utils.helpers import calculate_qparams, generate_gparam

    scheme = compression_scheme(scheme_name)
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
    elif scheme_name in ("W4A16", "W8A16_CHANNEL"):  # the library's qparams, bfloat16 scales, its packing compressor
        from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor

        for name, w in upcast.items():
            if args.strategy == "group":
                groups = w.reshape(w.shape[0], -1, args.group_size)
                scale, _ = calculate_qparams(groups.amin(-1), groups.amax(-1), args)
            else:  # per output channel
                scale, _ = calculate_qparams(w.amin(1, keepdim=True), w.amax(1, keepdim=True), args)
            state = PackedQuantizationCompressor.compress({"weight": w, "weight_scale": scale.to(torch.bfloat16)},
                                                          scheme)
            out.update({f"{name}.{k}": v for k, v in state.items()})
    else:
        raise ValueError(f"not a quantising scheme: {scheme_name}")
    return out



class RecipeQuantizer:
    """A compressed-tensors converter that quantises each planned module (`schemes`: module -> scheme, from `plan`)
    with its fused group, and adds the FP8 KV-cache scales (`kv_scales`: tensor name -> scale) to the shard holding
    each attention layer's k_proj. The groups are indexed once here: the converter asks `get_dependencies` of every
    tensor, and a scan of all names per call made that quadratic (3 hours of set-up for an 80B MoE's 75k tensors)."""

    def __init__(self, schemes: dict[str, str], table: dict[str, tuple[str, ...]],
                 kv_scales: dict[str, float] | None = None, input_amax: dict[str, float] | None = None,
                 report: bool = True):
        from build.quantize.fused import groups

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
        # each scheme with its format, as the library's compressor sets it (format.py
        # `infer_and_set_per_module_quantization_format`); the converter's hook leaves that to us
        groups = {f"group_{i}": library_scheme(scheme, sorted(targets[scheme])).model_copy(
            update={"format": FORMATS[scheme]}) for i, scheme in enumerate(s for s in FORMATS if s in targets)}
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


def reference_quantize(model: str | Path, recipe_path: str | Path, out: str | Path,
             kv_scales: dict[str, float] | None = None, input_amax: dict[str, float] | None = None,
             report: bool = True) -> dict[str, dict]:
    """`model` quantised by the recipe into `out` by compressed-tensors' converter and compressors; the report."""
    from compressed_tensors.entrypoints.convert import convert_checkpoint
    from compressed_tensors.utils.safetensors_load import get_checkpoint_files

    from build.quantize.fused import table_for

    model, out = Path(model), Path(out)
    if out.exists():
        raise ValueError(f"{out}: already exists; refusing to overwrite")
    recipe = load_recipe(recipe_path)
    config = json.loads((model / "config.json").read_text())
    files = [path for name, path in get_checkpoint_files(str(model)).items() if name.endswith(".safetensors")]
    schemes = plan(recipe, tensor_shapes(files), config, str(model))
    quantizer = RecipeQuantizer(schemes, table_for(config), kv_scales, input_amax, report)
    partial = out.with_name(out.name + ".partial")
    convert_checkpoint(str(model), str(partial), converter=quantizer, max_workers=1,
                       device="cpu")
    (partial / "quantization_report.json").write_text(json.dumps(
        {"recipe": recipe.name, "recipe_file": str(Path(recipe_path).resolve()), "tensors": quantizer.report,
         "kv_scales": kv_scales or {}},
        indent=1))
    partial.rename(out)
    return quantizer.report
