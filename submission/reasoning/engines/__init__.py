"""The engines behind one protocol (base: `GenerationRequest` in, `Completion` out): hf (transformers), vllm
(in-process AsyncLLM), replay (logged attempts). `make_engine` builds the one a profile names; each is imported only
when chosen (vLLM and torch are heavy, and the replay engine needs neither).

Part of the reasoning line's room (only that line drives a chat engine: the grid line runs its own model in its
workers, the simulator models serving without one). May import: submission's core and the rest of the line (the reply
grammar, the profile types, the prompt). Must not import: the line's run, the profiles, the grid line,
submission/kaggle/; build/, training/, sim/ (tests/test_imports.py).
vllm_logits*.py and vllm_scheduler.py import nothing of the kit: vLLM loads them by name in its workers.
"""

from __future__ import annotations

from submission.reasoning.profile import Profile


def make_engine(profile: Profile):
    """The engine of `profile.engine.kind`, not started."""
    kind, model = profile.engine.kind, profile.engine.model
    if kind == "hf":
        from submission.reasoning.engines.hf import HFEngine

        return HFEngine(model, profile.engine)
    if kind == "replay":
        from submission.attempts import read_log
        from submission.reasoning.engines.replay import ReplayEngine

        return ReplayEngine(read_log(model), profile.engine, profile.engine.replay_time_scale)
    from submission.reasoning.engines.vllm import VLLMEngine

    return VLLMEngine(model, profile.engine)
