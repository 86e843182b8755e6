"""The tool agent (SPEC section 5): turn caps under the budget, the tool turn's text and its rendering through the
chat template, and first attempts that check their programs between turns, on real ARC tasks and the real sandbox
(a scripted engine says what each turn answers); end to end with the hf engine where the engine environment is."""

from __future__ import annotations

import asyncio
import dataclasses
import json

import pytest

from submission.reasoning.reply_grammar import CALL_OPEN, FENCE, THINK_END, Reply
from submission.attempts import AttemptRecord
from submission.reasoning.profile import EngineConfig, Profile, PromptConfig
from submission.reasoning.engines.base import Completion, ThroughputMeter
from submission.profiles import PROFILES
from submission.reasoning.prompt import FIX, check_text, grid_text
from submission.sandbox.client import Sandbox
from submission.schedule import Level, Request
from submission.selection import Candidates
from submission.reasoning.solve import Attempts
from submission.tasks import load_tasks
from submission.reasoning.tool_agent import (LAST_CHECK, NO_CALL, ToolAgentConfig, finished, first_cap, instructions,
                                             next_turn, within_tokens)

CONFIG = ToolAgentConfig(enabled=True)
EOT = 7  # the end-of-turn id of the scripted engine and tool turn below
IDENTITY = "def transform(grid):\n    return grid\n"
ROTATE = "def transform(grid):\n    return [row[::-1] for row in grid[::-1]]\n"
FLIP = "def transform(grid):\n    return grid[::-1]\n"


def rotate_except(test_input, instead: str) -> str:
    """A program train-perfect on 3c9b0459 (rotation by 180 degrees) that does `instead` on the test input."""
    return (f"def transform(grid):\n    if grid == {[list(r) for r in test_input]!r}:\n        {instead}\n"
            "    return [row[::-1] for row in grid[::-1]]\n")


@pytest.fixture(scope="module")
def tasks(arc_data):
    found = load_tasks(arc_data / "arc-agi-2" / "training", arc_data / "arc-agi-2" / "training")
    return {t.id: t for t in found.tasks}


def test_turn_caps_follow_the_budget():
    assert (CONFIG.call_reserve, CONFIG.feedback_reserve, CONFIG.answer_reserve) == (100, 800, 800)
    assert first_cap(CONFIG, True) == 80_000
    assert first_cap(CONFIG, False) == 48_000  # SPEC 5: 48K of 64K for a task with several test inputs
    assert first_cap(dataclasses.replace(CONFIG, budget_multi=44_100), False) == 44_000  # the budget bounds it
    free = 10**9  # no deadline, no context limit
    assert next_turn(CONFIG, 1, 70_000, True, free) == (8_000, False)
    # SPEC 5's continuation rule: a later turn while >= 1,000 thinking tokens fit after reserving its call (100), the
    # response (800) and the final turn (4K + 800): 96K - 89.3K - 5.7K = 1,000 fits, one token more does not
    assert next_turn(CONFIG, 1, 89_300, True, free) == (1_000, False)
    assert next_turn(CONFIG, 1, 89_301, True, free) == (4_000, True)  # the final turn instead, always
    assert next_turn(CONFIG, 1, 95_000, True, free) == (200, True)  # what is left after its answer
    assert next_turn(CONFIG, 1, 95_200, True, free) == (0, True)  # nothing left: it closes at once (seed ~3462)
    assert next_turn(CONFIG, 1, 99_000, True, free) == (0, True)  # past the budget too
    assert next_turn(CONFIG, 2, 10_000, True, free) == (4_000, True)  # after the last check: the final turn
    assert next_turn(CONFIG, 1, 10_000, True, free, verified=True) == (4_000, True)  # a verified program too
    assert next_turn(dataclasses.replace(CONFIG, checks=3), 2, 10_000, True, free) == (8_000, False)
    # the deadline cuts the budget: 5.9K thinking tokens left (+ an answer) hold a 1K later turn and the reserves
    assert next_turn(CONFIG, 1, 10_000, True, 5_900) == (1_000, False)
    assert next_turn(CONFIG, 1, 10_000, True, 5_899) == (4_000, True)
    assert next_turn(CONFIG, 1, 10_000, True, 3_000) == (3_000, True)
    assert next_turn(CONFIG, 1, 10_000, True, -5) == (0, True)  # the caller stops before: no request fits
    assert finished(True, ((1,),)) and not finished(True, None) and not finished(False, ((1,),))
    with pytest.raises(ValueError, match="tool_agent"):
        ToolAgentConfig(checks=0)


def test_check_text_shows_failing_pairs_and_a_small_test_output():
    demos = [(((1, 2),), ((1, 2),), "right"), (((1, 2),), ((2, 2),), "wrong"), (((3,),), None, "ZeroDivisionError"),
             (((4,),), ((4, 4),), "wrong")]
    text = check_text(demos, ((5, 6),), "", failing_pairs=2)
    assert text.startswith("check_transform: 1 of 4 examples reproduced.")
    assert "Example 1: correct." in text and "Example 2: 1 cells differ (row, column): (0,0) expected 1 got 2" in text
    assert "Example 3: no grid (ZeroDivisionError)." in text and "Example 4: produced a 1x2 grid, expected 1x1." in text
    assert "Example 2 expected:\n1x2\n1 2\nExample 2 produced:\n1x2\n2 2" in text
    assert "Example 3 expected:\n1x1\n3" in text and "Example 4 expected:" not in text  # two failing pairs only
    assert "Test input produced:\n1x2\n5 6" in text
    assert "Test input produced" not in check_text(demos, ((5, 6),), "", test_output_max_cells=1)
    assert "Test input: no grid (timeout)." in check_text(demos, None, "timeout")
    assert "expected:" not in check_text(demos, None, "timeout", grids=False)


def test_within_tokens_prefers_detail_then_cuts_lines():
    encode = list  # one token per character
    assert within_tokens(["long text", "short"], encode, 6) == list("short")
    assert within_tokens(["long text", "short"], encode, 20) == list("long text")
    assert within_tokens(["a\nbbbbbbbbbb\nend"], encode, 6) == list("a\nend")  # the closing line is kept


def answer(grid, program=None, finish="stop"):
    """A turn that answers: `</think>`, the grid (None: none), the program (None: none)."""
    return (THINK_END + (f"\n{grid_text(grid)}\n" if grid else "") + (
        f"{EngineConfig().program_cue}{program.split('def transform(grid):', 1)[1]}{FENCE}" if program else ""), finish)


def call(program, closed=True, finish="stop"):
    """A turn that calls check_transform (its code block cut off when not `closed`: the answer limit)."""
    return (f"{THINK_END}\n{CALL_OPEN}{program.split('def transform(grid):', 1)[1]}" + (FENCE if closed else ""),
            finish)


class Scripted:
    """An engine that answers each turn with the next scripted (text, finish), as a model under the grammar would."""

    def __init__(self, turns: list[tuple[str, str]]):
        self.turns, self.requests = turns, []
        self.meter = ThroughputMeter()  # the Engine protocol's: an attempt record reads it

    async def generate(self, request):
        text, finish = self.turns[min(len(self.requests), len(self.turns) - 1)]
        self.requests.append(request)
        return Completion(request.request_id, text, 100, 50, True, finish, 0.0, 0.0, token_ids=(1, 2, 3, EOT))


def run_attempt(task, engine, level=Level.FIRST, config=CONFIG, clock=lambda: 0.0, cap=4000, extras=None):
    tool_texts = []

    def tool_turn(text):
        tool_texts.append(text)
        return [EOT, 9, 9, 9]

    def render(task, test_index, view, extra):
        (extras if extras is not None else []).append(extra)
        return [5] * 10

    profile = dataclasses.replace(Profile(), tool_agent=config)
    with Sandbox() as box:
        attempts = Attempts(profile, {task.id: task}, engine, box, render, clock, tool_turn)
        record = asyncio.run(attempts.run(Request(task.id, 0, 1, level, cap, 1)))
    return record, tool_texts


def test_the_first_turn_is_a_check(tasks):
    """Algorithm 7 line 4 (seed ~3443): the first turn emits a `check_transform` call; the final grid and program are
    allowed from the second turn on. The first turn's grammar admits only the call; an answer that comes anyway (an
    engine without the grammar) is not accepted: its program is checked as the call, and the next turn answers."""
    task = tasks["3c9b0459"]
    extras = []
    engine = Scripted([answer(((1,),), IDENTITY), answer(((2,),), ROTATE)])
    record, texts = run_attempt(task, engine, extras=extras)
    assert [r.reply for r in engine.requests] == [Reply.CALL, Reply.EITHER]
    assert len(texts) == 1 and texts[0].startswith(f"check_transform: 0 of {len(task.train)}")  # identity, checked
    assert record.turns == 2 and record.grid == ((2,),) and record.train_perfect and record.program == ROTATE
    assert extras[-1] == instructions(2) and CALL_OPEN in extras[-1] and "at most 2 times" in extras[-1]
    assert "first reply must be such a check" in extras[-1]


def test_from_the_second_turn_an_answer_ends_the_attempt(tasks):
    engine = Scripted([call(IDENTITY), answer(((1,),), IDENTITY)])
    record, texts = run_attempt(tasks["3c9b0459"], engine)
    assert [r.reply for r in engine.requests] == [Reply.CALL, Reply.EITHER] and len(texts) == 1
    assert record.turns == 2 and record.grid == ((1,),) and not record.train_perfect and record.program == IDENTITY


def test_a_wrong_program_is_shown_its_checks_twice_then_answers(tasks):
    task = tasks["3c9b0459"]  # rotate by 180 degrees, one test input
    engine = Scripted([call(IDENTITY), call(IDENTITY), answer(((1,),), IDENTITY)])
    record, texts = run_attempt(task, engine)
    assert [r.thinking_cap for r in engine.requests] == [4000, 8000, 4000]  # the scheduler's cap, later, final
    assert [r.reply for r in engine.requests] == [Reply.CALL, Reply.EITHER, Reply.ANSWER]  # the final: no call
    assert record.turns == 3 and record.thinking_tokens == 300 and record.answer_tokens == 150
    assert record.turn_tokens == (150, 150, 150) and record.tool_tokens == 8  # for the simulator (sim.agent)
    first, second, third = (list(r.prompt_ids) for r in engine.requests)
    assert second == first + [1, 2, 3] + [EOT, 9, 9, 9]  # sampled ids (its end of turn shared), tool turn
    assert third[:len(second)] == second
    assert texts[0].startswith(f"check_transform: 0 of {len(task.train)} examples reproduced.")
    assert "Example 1 expected:" in texts[0] and "Test input produced:" in texts[0]
    assert texts[0].endswith(FIX) and texts[1].endswith(LAST_CHECK)
    assert not record.train_perfect and record.grid == ((1,),) and not record.aborted


def test_a_train_perfect_call_goes_to_the_final_turn_and_its_program_is_kept(tasks):
    engine = Scripted([call(ROTATE), answer(((2,),), IDENTITY)])
    record, texts = run_attempt(tasks["3c9b0459"], engine)
    assert [(r.thinking_cap, r.reply) for r in engine.requests] == [(4000, Reply.CALL), (4000, Reply.ANSWER)]
    assert texts[0].startswith("check_transform: 4 of 4") and texts[0].endswith(LAST_CHECK)
    # the answer's grid; the verified program (the answer's own is not train-perfect) and its test output
    assert record.turns == 2 and record.grid == ((2,),) and record.train_perfect and record.program == ROTATE
    assert record.program_outputs[0] == tuple(tuple(r[::-1]) for r in tasks["3c9b0459"].test_inputs[0][::-1])


def test_a_fix_after_the_first_check(tasks):
    engine = Scripted([call(IDENTITY), call(ROTATE), answer(((2,),), ROTATE)])
    record, texts = run_attempt(tasks["3c9b0459"], engine)
    assert record.turns == 3 and record.train_perfect and record.grid == ((2,),) and len(texts) == 2


def test_only_first_attempts_and_only_when_enabled(tasks):
    task = tasks["3c9b0459"]
    for level, config in ((Level.SECOND, CONFIG), (Level.FIRST, ToolAgentConfig())):
        extras = []
        engine = Scripted([call(IDENTITY)])
        record, _ = run_attempt(task, engine, level=level, config=config, extras=extras)
        assert len(engine.requests) == 1 and record.turns == 1 and engine.requests[0].reply is Reply.ANSWER
        assert extras == [""]  # the plain prompt: no tool description


def test_budget_deadline_and_context_stop_the_turns(tasks):
    task = tasks["25ff71a9"]  # two test inputs: the 64K budget
    small = dataclasses.replace(CONFIG, budget_multi=2000)
    engine = Scripted([call(IDENTITY), answer(((1,),), IDENTITY)])
    record, _ = run_attempt(task, engine, config=small)
    # 2000 less the call's 100; then 2000 - 154 used less the answer's 800: no room for a later turn, the final turn
    assert [r.thinking_cap for r in engine.requests] == [1900, 1046]
    engine = Scripted([call(IDENTITY), answer(((1,),), IDENTITY)])
    record, _ = run_attempt(task, engine, config=dataclasses.replace(CONFIG, budget_multi=900))
    # 900 - 154 leaves less than the answer's 800: the final turn closes at once (seed ~3462) and still answers
    assert [r.thinking_cap for r in engine.requests] == [800, 0]
    assert engine.requests[1].reply is Reply.ANSWER and record.turns == 2 and record.grid == ((1,),)
    engine = Scripted([call(IDENTITY)])
    late = Profile().schedule.hard_stop - 600  # 8 tok/s: 8 * (600 - 240) - 3000 < 0: not even a final turn
    record, _ = run_attempt(task, engine, clock=lambda: late)
    assert record.turns == 1 and record.grid is None and record.program == IDENTITY  # the call's checked program
    engine = Scripted([call(IDENTITY), answer(((1,),), IDENTITY)])
    later = Profile().schedule.hard_stop - 1000  # 8 * (1000 - 240) - 3000 = 3,080 thinking tokens left
    record, _ = run_attempt(task, engine, clock=lambda: later)
    assert [r.thinking_cap for r in engine.requests] == [4000, 3080]  # the final turn, shrunk to the deadline
    profile = dataclasses.replace(Profile(), tool_agent=CONFIG,
                                  engine=EngineConfig(max_model_len=10 + 4 + 4 + 5900 - 800 + 3999))
    engine = Scripted([call(IDENTITY), answer(((1,),), IDENTITY)])
    with Sandbox() as box:
        attempts = Attempts(profile, {task.id: task}, engine, box, lambda *a: [5] * 10, lambda: 0.0,
                            lambda text: [EOT, 9, 9, 9, 9])
        asyncio.run(attempts.run(Request(task.id, 0, 1, Level.FIRST, 4000, 1)))
    # 5,100 thinking tokens fit the context (5,900 with an answer): not a 1K later turn and its reserves (6,700), so
    # the final turn
    assert [r.thinking_cap for r in engine.requests] == [4000, 4000]


@pytest.mark.parametrize("unreadable", [call(IDENTITY, closed=False, finish="length"),  # cut by the answer limit
                                        ("thinking ended by end of turn", "stop")])  # neither answer nor call
def test_an_unreadable_call_counts_as_a_check_and_the_loop_goes_on(tasks, unreadable):
    engine = Scripted([unreadable, call(IDENTITY), answer(((2,),), ROTATE)])
    record, texts = run_attempt(tasks["3c9b0459"], engine)
    assert texts[0] == NO_CALL and texts[1].startswith("check_transform: 0 of")  # told, then checked
    assert [r.thinking_cap for r in engine.requests] == [4000, 8000, 4000]  # two checks, then the final turn
    assert record.turns == 3 and record.train_perfect and record.grid == ((2,),)


def test_an_infrastructure_error_without_a_grid_falls_back_to_a_direct_attempt(tasks):
    engine = Scripted([("", "error: engine died"), answer(((2,),), ROTATE)])
    record, texts = run_attempt(tasks["3c9b0459"], engine, cap=6000)
    assert texts == [] and len(engine.requests) == 2 and record.turns == 2
    first, direct = engine.requests
    assert direct.thinking_cap == 6000 and direct.reply is Reply.ANSWER  # the request's cap, no call
    assert record.grid == ((2,),) and record.train_perfect and not record.aborted and record.finish == "stop"


@pytest.mark.parametrize("program", [ROTATE, IDENTITY])
def test_no_direct_attempt_after_a_checked_program(tasks, program):
    """Algorithm 7 line 17 (seed ~3470): the direct attempt replaces the agent only on an infrastructure error that
    left neither a grid nor a checked program. A final turn lost after a check keeps the check's program (a candidate
    if train-perfect, else in the weak pool) and runs no direct attempt."""
    task = tasks["3c9b0459"]
    engine = Scripted([call(program), ("", "error: engine died"), answer(((3,),), IDENTITY)])
    record, _ = run_attempt(task, engine)
    assert len(engine.requests) == 2 and record.grid is None and record.program == program
    output = run_program(program, task.test_inputs[0])
    if program == ROTATE:
        assert record.train_perfect and record.candidate_outputs == ((output,),) and record.weak_outputs == ()
    else:
        assert not record.train_perfect and record.candidate_outputs == () and record.weak_outputs == (output,)
    assert not record.aborted and record.finish == "stop"  # the attempt is finished: not retried


def run_program(program, grid):
    scope = {}
    exec(program, scope)
    return tuple(tuple(r) for r in scope["transform"]([list(r) for r in grid]))


def test_every_train_perfect_checked_program_is_a_candidate_in_check_order(tasks):
    """Algorithm 7 line 16 (seed ~3466-3468): checked programs the checker finds train-perfect, in check order, then
    the final program if it passes, are the program candidates; the final program repeating a checked one is not
    counted twice."""
    task = tasks["3c9b0459"]
    test_input = task.test_inputs[0]
    no_test = rotate_except(test_input, "raise ValueError('no test output')")  # train-perfect, no test output
    keeps = rotate_except(test_input, "return grid")  # train-perfect, the test input unchanged
    engine = Scripted([call(no_test), call(keeps), answer(((2,),), ROTATE)])
    record, texts = run_attempt(task, engine)
    assert texts[0].startswith("check_transform: 4 of 4") and texts[0].endswith(FIX)  # no test output: go on
    assert texts[1].endswith(LAST_CHECK) and record.turns == 3
    rotated = run_program(ROTATE, test_input)
    assert record.candidate_outputs == ((None,), (test_input,), (rotated,)) and record.weak_outputs == ()
    assert record.program == no_test and record.train_perfect  # the first candidate
    candidates = Candidates()
    candidates.add_record(record)
    assert candidates.answers((task.id, 0)) == (test_input, rotated)  # both programs, in check order, before the grid
    assert AttemptRecord.from_json(record.to_json()) == record
    engine = Scripted([call(ROTATE), answer(((2,),), ROTATE)])  # the final answer repeats the verified call
    record, _ = run_attempt(task, engine)
    assert record.candidate_outputs == ((rotated,),)


def test_programs_that_ran_but_are_not_train_perfect_join_the_weak_pool(tasks):
    """Algorithm 7 line 16: other programs that ran with a valid test output join the weak pool, which fills the slot
    the candidates leave empty (submission.selection)."""
    task = tasks["3c9b0459"]
    test_input = task.test_inputs[0]
    rotated = run_program(ROTATE, test_input)
    crashes = "def transform(grid):\n    return 1 / 0\n"  # ran, without a test output: not in the pool
    engine = Scripted([call(crashes), call(FLIP), answer(rotated, ROTATE)])
    record, _ = run_attempt(task, engine)
    assert record.candidate_outputs == ((rotated,),) and record.weak_outputs == (run_program(FLIP, test_input),)
    candidates = Candidates()
    candidates.add_record(record)
    assert candidates.answers((task.id, 0)) == (rotated, run_program(FLIP, test_input))  # not [[0]]


def test_no_direct_fallback_after_an_abort(tasks):
    engine = Scripted([("", "aborted")])  # the hard stop: no new request
    record, _ = run_attempt(tasks["3c9b0459"], engine)
    assert len(engine.requests) == 1 and record.aborted


def test_tool_turn_continues_the_conversation_as_the_template_writes_it(tmp_path):
    pytest.importorskip("transformers", reason="needs a tokenizer (the engine or build environment)")
    from build.models.tiny import make_tokenizer
    from submission.reasoning.prompt import tool_turn

    tokenizer = make_tokenizer(tmp_path)
    text, ids = tool_turn(tokenizer, "check_transform: 0 of 3 examples reproduced.", PromptConfig())
    eot = tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert ids[0] == eot and text.startswith("<|im_end|>")
    conversation = [{"role": "user", "content": "task"},
                    {"role": "assistant", "content": "answer", "reasoning_content": "r"},
                    {"role": "tool", "content": "check_transform: 0 of 3 examples reproduced."}]
    whole = tokenizer.apply_chat_template(conversation, tokenize=False, add_generation_prompt=True,
                                          enable_thinking=True)
    assert whole.endswith(text) and whole.endswith("<|im_start|>assistant\n<think>\n")
    hybrid = tokenizer.chat_template.replace("{%- else %}{{- '<think>\\n' }}{%- endif %}", "{%- endif %}")
    assert hybrid != tokenizer.chat_template
    tokenizer.chat_template = hybrid  # as Qwen3's hybrid models: the model opens <think> itself
    text, ids = tool_turn(tokenizer, "x", PromptConfig())
    assert text.endswith("<|im_start|>assistant\n<think>\n")  # written for it: vLLM must see thinking open again
    tokenizer.chat_template = "{%- for m in messages %}{{ m.role }}{{ loop.length }}:{{ m.content }}{%- endfor %}"
    with pytest.raises(ValueError, match="changes the turns before it"):
        tool_turn(tokenizer, "x", PromptConfig())


@pytest.mark.timeout(600)
def test_solver_runs_the_tool_agent_on_the_tiny_model(tmp_path, arc_data):
    pytest.importorskip("torch", reason="needs the engine environment (make engine-env)")
    pytest.importorskip("xgrammar", reason="needs the engine environment (make engine-env)")
    import submission.main as solver
    from build.models.tiny import make_checkpoint

    model = make_checkpoint(tmp_path / "tiny", "qwen3", seed=0)
    profile = (PROFILES / "cpu-tiny.toml").read_text() + (
        "\n[tool_agent]\nenabled = true\nfirst_thinking = 48\nfirst_thinking_multi = 48\nlater_thinking = 40\n"
        "final_thinking = 32\n"
        "budget_single = 20000\nbudget_multi = 20000\n")
    (tmp_path / "agent.toml").write_text(profile)
    log = tmp_path / "attempts.jsonl"
    code = solver.main(["--tasks", str(arc_data / "arc-agi-2" / "evaluation"), "--max-tasks", "2", "--profile",
                        str(tmp_path / "agent.toml"), "--model", str(model), "--deadline", "240",
                        "--out", str(tmp_path / "submission.json"), "--log", str(log)])
    assert code == 0
    records = [json.loads(line) for line in log.read_text().splitlines()]
    first = [r for r in records if r["level"] == int(Level.FIRST)]
    # the first turn calls (its grammar admits nothing else), then the random model calls or answers as it samples;
    # the final turn's grammar admits no call, so every first attempt ends with a grid, after one or two checks
    assert first and all(r["grid"] is not None and 2 <= r["turns"] <= 3 for r in first), first
    print("turns of the first attempts:", [r["turns"] for r in first])
    assert all(r["thinking_tokens"] <= 48 + 40 + 32 for r in first)  # each turn within its cap
    assert all(r["turns"] == 1 for r in records if r["level"] != int(Level.FIRST))
    submission = json.loads((tmp_path / "submission.json").read_text())
    assert len(submission) == 2


def test_the_budget_arithmetic_is_the_studys():
    """The 56.67 run's agent (study ~3429-3430, ~4503-4504): 75K tokens, thinking caps of 59,000 and 8,000 and a
    final 4K (~3435). 59K + 8K + 4K of thinking leave 4K for two calls, two tool responses and the answer; the
    reserves (what those usually take, sim.agent_turns) fit in it, so a first turn that used its whole cap still gets
    its second check at the full 8K (~3441-3442) and the final turn its 4K; a spent budget closes it at once (~3462)."""
    study = dataclasses.replace(CONFIG, budget_single=75_000, first_thinking=59_000)
    assert (study.later_thinking, study.final_thinking, study.min_turn_thinking) == (8_000, 4_000, 1_000)
    other = 2 * (study.call_reserve + study.feedback_reserve) + study.answer_reserve
    assert 59_000 + 8_000 + 4_000 + other <= 75_000
    free = 10**9  # no deadline, no context limit
    turn = study.call_reserve + study.feedback_reserve  # a call and its response, as the reserves count them
    assert first_cap(study, True) == 59_000
    assert next_turn(study, 1, 59_000 + turn, True, free) == (8_000, False)
    assert next_turn(study, 2, 59_000 + 8_000 + 2 * turn, True, free) == (4_000, True)
    assert next_turn(study, 2, 75_000 - study.answer_reserve, True, free) == (0, True)
    # The kit's reserves before (an answer of answer_max_tokens 4,000 for the call and for the final turn, the 2,500
    # response limit, the final 4,000): a first turn of more than 57.9K of its 59K cap, with a call and response of
    # 1.6K, got no second check (issue 44); now it does.
    before = dataclasses.replace(study, call_reserve=4_000, feedback_reserve=2_500, answer_reserve=4_000)
    assert next_turn(before, 1, 57_900 + 1_600, True, free) == (1_000, False)
    assert next_turn(before, 1, 58_000 + 1_600, True, free)[1]
    assert next_turn(study, 1, 58_000 + 1_600, True, free) == (8_000, False)
