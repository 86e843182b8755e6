"""Run a checkpoint one decoder layer at a time, straight from its shards, so a model far larger than memory can be
calibrated and scored with one layer resident (llm-compressor's sequential pipeline, without its tracing).

The model is built by transformers on the meta device (no memory); the embedding, the final norm and (for scoring)
the output head are loaded; each chunk of traces (at most `chunk_tokens` tokens, at least one trace) is embedded, and
the arguments transformers hands each decoder layer (rotary position embeddings, the causal or linear-attention mask)
are captured by stand-ins run in the model's own forward. Then layer 0 is loaded from the shards, run on every trace
of the chunk, dropped; layer 1; and so on. Hidden states of the chunk's traces stay on the device between layers:
memory is one layer's weights plus the chunk's activations, whatever the depth. Quantised checkpoints
(compressed-tensors) are dequantised module by module as their layer loads: no dequantised copy is written.
Checkpoint tensors go into transformers' modules under transformers' own names: per-expert weights
(`mlp.experts.E.{gate,up,down}_proj.weight`) are copied one at a time into the fused `experts.gate_up_proj` /
`experts.down_proj` that Qwen3-MoE and Qwen3-Next keep in memory, allocated once at their final size, and every other
weight is converted as it is read: loading a layer holds about its converted bytes (`Shards.load`). MTP weights
(`mtp.*`) are not part of the transformers model and are never loaded, nor is Qwen3.5's vision tower (transformers'
causal-LM class of its config is the text model, whose weights the release keeps under `model.language_model.`).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator

from build.checkpoint import text_prefix
from build.schemes import dequantize, preset_of

if TYPE_CHECKING:
    import torch

EXPERT = re.compile(r"^(.*\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")


def chunks(lengths: list[int], chunk_tokens: int) -> list[list[int]]:
    """Consecutive trace indices grouped so each group holds at most `chunk_tokens` tokens (a longer trace alone).
    Pure."""
    out: list[list[int]] = []
    size = 0
    for index, length in enumerate(lengths):
        if out and size + length <= chunk_tokens:
            out[-1].append(index)
            size += length
        else:
            out.append([index])
            size = length
    return out


class Shards:
    """Tensors of a checkpoint by name prefix, read from its safetensors shards on demand; modules a
    compressed-tensors `quantization_config` lists are dequantised with the library's own compressors."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        index = self.folder / "model.safetensors.index.json"
        if index.exists():
            self.weight_map = json.loads(index.read_text())["weight_map"]
        else:
            from safetensors import safe_open

            with safe_open(self.folder / "model.safetensors", framework="pt") as f:
                self.weight_map = {name: "model.safetensors" for name in f.keys()}
        config = json.loads((self.folder / "config.json").read_text())
        self.schemes: dict[str, str] = {}  # module -> preset scheme name
        for group in config.get("quantization_config", {}).get("config_groups", {}).values():
            scheme = preset_of(group)
            self.schemes.update({target: scheme for target in group.get("targets", [])})

    def tensors(self, prefix: str) -> Iterator[tuple[str, "torch.Tensor"]]:
        """Every weight whose name starts with `prefix`, keyed without it, one at a time, shard by shard, as stored
        (a quantised module's weight dequantised once all its parts are read; their scales and k/v cache scales are
        not yielded): a caller that keeps only what it converts never holds a second copy of the layer."""
        from safetensors import safe_open

        by_file: dict[str, list[str]] = {}
        parts: dict[str, int] = {}  # quantised module -> how many of its tensors are stored
        for name in self.weight_map:
            if name.startswith(prefix):
                by_file.setdefault(self.weight_map[name], []).append(name)
                module = name.rpartition(".")[0]
                if module in self.schemes:
                    parts[module] = parts.get(module, 0) + 1
        pending: dict[str, dict] = {}  # a quantised module's parts read so far (they may span shards)
        for file, members in by_file.items():
            with safe_open(self.folder / file, framework="pt") as f:
                for name in members:
                    module, _, leaf = name.rpartition(".")
                    if module in parts:
                        state = pending.setdefault(module, {})
                        state[name] = f.get_tensor(name)
                        if len(state) < parts[module]:
                            continue
                        del pending[module], parts[module]
                        if any(n.endswith((".weight", ".weight_packed")) for n in state):
                            yield f"{module}.weight"[len(prefix):], dequantize(state, module, self.schemes[module])
                    elif leaf not in ("k_scale", "v_scale"):
                        yield name[len(prefix):], f.get_tensor(name)

    def read(self, prefix: str, dtype) -> dict:
        """Every weight whose name starts with `prefix`, keyed without it, in `dtype` (dequantised where needed)."""
        return {name: tensor.to(dtype) for name, tensor in self.tensors(prefix)}

    def load(self, prefix: str, dtype, device: str = "cpu") -> dict:
        """The weights under `prefix` as transformers' modules hold them, in `dtype` on `device`: per-expert weights
        (`experts.E.{gate,up,down}_proj.weight`) are copied one at a time, converted on the way, into the stacked
        `experts.gate_up_proj` (gate then up rows) and `experts.down_proj` allocated once at their final size; every
        other weight is converted as it is read. So loading a layer holds its converted bytes plus one stored tensor,
        not the stored layer, its conversion and the stacked copies together (2.3x one layer before issue 17's
        measurement, benchmarks/RESULTS.md)."""
        import torch

        order: dict[str, set[int]] = {}  # experts prefix -> expert numbers stored
        for name in self.weight_map:
            module = name[len(prefix):].rpartition(".")[0]  # quantised: weight_packed, weight_scale, ...
            if name.startswith(prefix) and (m := EXPERT.match(f"{module}.weight")):
                order.setdefault(m.group(1), set()).add(int(m.group(2)))
        position = {(experts, e): i for experts, numbers in order.items() for i, e in enumerate(sorted(numbers))}
        out = {}
        for name, tensor in self.tensors(prefix):
            if not (m := EXPERT.match(name)):
                out[name] = tensor.to(device=device, dtype=dtype)
                continue
            experts, number, kind = m.group(1), int(m.group(2)), m.group(3)
            fused = f"{experts}.down_proj" if kind == "down" else f"{experts}.gate_up_proj"
            if fused not in out:
                rows, columns = tensor.shape
                out[fused] = torch.empty((len(order[experts]), rows if kind == "down" else 2 * rows, columns),
                                         dtype=dtype, device=device)
            target = out[fused][position[experts, number]]
            rows = tensor.shape[0]
            target = target if kind == "down" else target[:rows] if kind == "gate" else target[rows:]
            target.copy_(tensor)
            del tensor, target
        return out


def _capture_class():
    import torch

    class Capture(torch.nn.Module):
        """Stands in for a decoder layer while the model's own forward runs: keeps the arguments it is handed and
        passes the hidden states through unchanged."""

        def __init__(self, layer):
            super().__init__()
            self.layer_type = getattr(layer, "layer_type", None)
            self.attention_type = getattr(layer, "attention_type", None)
            self.calls: list[tuple[tuple, dict]] = []

        def forward(self, hidden_states, *args, **kwargs):
            self.calls.append((args, kwargs))
            return hidden_states

    return Capture


@dataclass(frozen=True)
class Step:
    """What `run` reports after each layer: which, and the bytes of parameters resident on the device."""
    chunk: int
    layer: int
    resident_bytes: int


class LayerRunner:
    """The model of `folder` on the meta device, with the embedding and final norm (and with `head`, the output head)
    loaded. `run` yields, per chunk of traces, the final hidden states; `on_layer(index, layer, chunk)` sees each
    loaded layer before it runs on the chunk's traces and returns the hook handles to remove after."""

    def __init__(self, folder: str | Path, device: str = "cpu", dtype: str = "float32", head: bool = False):
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        self.folder, self.device, self.dtype = Path(folder), device, getattr(torch, dtype)
        self.shards = Shards(folder)
        self.config = AutoConfig.from_pretrained(folder)
        with torch.device("meta"):
            self.model = AutoModelForCausalLM.from_config(self.config, dtype=self.dtype)
        self.base = self.model.model
        self.prefix = text_prefix(self.shards.weight_map)  # `model.language_model.` in Qwen3.5's multimodal release
        self._load(self.base.embed_tokens, f"{self.prefix}embed_tokens.")
        self._load(self.base.norm, f"{self.prefix}norm.")
        self.base.rotary_emb = type(self.base.rotary_emb)(config=self.base.config).to(device)  # computed buffers
        self.head = None
        if head:
            tied = "lm_head.weight" not in self.shards.weight_map
            self.head = self.base.embed_tokens if tied else self._load(self.model.lm_head, "lm_head.")
        self.layers = list(self.base.layers)

    def _load(self, module, prefix: str):
        module.load_state_dict(self.shards.load(prefix, self.dtype, self.device), strict=True, assign=True)
        return module

    def resident_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters() if p.device.type != "meta")

    def run(self, traces: list[list[int]], chunk_tokens: int = 65536,
            on_layer: Callable | None = None, progress: Callable[[Step], None] | None = None
            ) -> Iterator[tuple[list[int], list]]:
        """Yield (trace indices, final hidden states [tokens, hidden] per trace, after the final norm) per chunk."""
        import torch

        for number, group in enumerate(chunks([len(t) for t in traces], chunk_tokens)):
            capture = _capture_class()
            captures = [capture(layer) for layer in self.layers]
            self.base.layers = torch.nn.ModuleList(captures)
            hidden = []
            try:
                with torch.no_grad():
                    for index in group:
                        ids = torch.tensor([traces[index]], device=self.device)
                        embedded = self.base.embed_tokens(ids)
                        self.base(inputs_embeds=embedded, use_cache=False)
                        hidden.append(embedded)
            finally:
                self.base.layers = torch.nn.ModuleList(self.layers)
            with torch.no_grad():
                for i, layer in enumerate(self.layers):
                    self._load(layer, f"{self.prefix}layers.{i}.")
                    handles = on_layer(i, layer, group) if on_layer is not None else []
                    for position, (args, kwargs) in enumerate(captures[i].calls):
                        out = layer(hidden[position], *args, **kwargs)
                        hidden[position] = out[0] if isinstance(out, tuple) else out
                    for handle in handles:
                        handle.remove()
                    if progress is not None:
                        progress(Step(number, i, self.resident_bytes()))
                    layer.to("meta")
                yield group, [self.base.norm(h)[0] for h in hidden]
