"""Static activation scales: the largest input each quantised projection sees on calibration prompts.

Static schemes quantise activations with a scale fixed in the checkpoint instead of one computed per token:
`FP8` (per-tensor FP8 weights and inputs; input_scale = amax / 448) and `NVFP4` (W4A4; input_global_scale =
448 x 6 / amax, as for weights). The amax comes from the solver's own prompts (build.kv_scales.calibration_prompts).
Linear modules are observed with forward pre-hooks; the routed experts of a MoE block, which transformers keeps fused,
are observed in the experts' forward: each expert's gate/up input is the hidden state of the tokens routed to it, its
down input the activation computed from its own weights.
"""

from __future__ import annotations

from pathlib import Path


def input_amax(model_dir: str | Path, prompts: list[list[int]], device: str = "cpu") -> dict[str, float]:
    """Module name (as in the checkpoint, without `.weight`) -> largest absolute input value over the prompts."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(device).eval()
    amax: dict[str, float] = {}
    handles = []

    def note(name: str, value: float) -> None:
        amax[name] = max(amax.get(name, 0.0), value)

    for name, module in model.named_modules():
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
    with torch.no_grad():
        for ids in prompts:
            model(torch.tensor([ids], device=device))
    for handle in handles:
        handle.remove()
    return amax
