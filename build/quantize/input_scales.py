"""Static activation scales: the largest input each quantised projection sees on calibration prompts, observed layer
by layer together with the FP8 KV-cache scales (build.quantize.kv_scales) in one pass.

Static schemes quantise activations with a scale fixed in the checkpoint instead of one computed per token:
`FP8` (per-tensor FP8 weights and inputs; input_scale = amax / 448) and `NVFP4` (W4A4; input_global_scale =
448 x 6 / amax, as for weights). The amax comes from the solver's own prompts
(build.quantize.kv_scales.calibration_prompts). The model runs one decoder layer at a time from its shards
(build.quantize.activations, through build.layerwise as build.prune.calibrate does): memory is one layer's weights plus
the prompts' hidden states, so an 80B MoE calibrates its scales in the memory of one layer; this module holds the hooks
that observe the inputs. Linear modules are observed with forward pre-hooks; the routed experts of a MoE block, which
transformers keeps fused, are observed in the experts' forward: each expert's gate/up input is the hidden state of the
tokens routed to it, its down input the activation computed from its own weights. `lm_head`'s input is the final normed
hidden state. MTP layers (`mtp.*`) are not part of the transformers model and get no observation, as before.
"""

from __future__ import annotations


def observe_inputs(root, prefix: str, amax: dict[str, float]) -> list:
    """Hooks on every linear module and fused-expert block under `root` that raise `amax[prefix + module name]` to the
    largest absolute input seen; returns the handles. `root` is a whole model (prefix "") or one decoder layer."""
    import torch

    def note(name: str, value: float) -> None:
        amax[name] = max(amax.get(name, 0.0), value)

    handles = []
    for name, module in root.named_modules():
        name = prefix + name
        if isinstance(module, torch.nn.Linear):
            handles.append(module.register_forward_pre_hook(
                lambda m, args, name=name: note(name, float(args[0].detach().abs().max()))))
        elif hasattr(module, "gate_up_proj") and hasattr(module, "down_proj"):
            def experts(m, args, kwargs, output, name=name):
                names = ("hidden_states", "top_k_index", "top_k_weights")
                hidden, index = (list(args) + [kwargs[n] for n in names[len(args):]])[:2]
                with torch.no_grad():
                    for e in torch.unique(index).tolist():
                        rows = hidden[torch.where(index == e)[0]]
                        note(f"{name}.{e}.gate_proj", float(rows.abs().max()))
                        note(f"{name}.{e}.up_proj", float(rows.abs().max()))
                        gate, up = torch.nn.functional.linear(rows, m.gate_up_proj[e]).chunk(2, dim=-1)
                        note(f"{name}.{e}.down_proj", float((m.act_fn(gate) * up).abs().max()))
            handles.append(module.register_forward_hook(experts, with_kwargs=True))
    return handles
