"""The simulator's tool agent (sim/agent.py): turns and tokens per turn learned from logs, and an agent attempt run
as the chain of requests it was (each turn re-prefilling the conversation so far)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from sim.agent import TurnModel
from sim.pool import AttemptPool, SimAttempt
from sim.run import LatencyEngine, simulate
from submission.attempts import AttemptRecord
from submission.schedule import InputInfo, Level, Request, ScheduleConfig

G = ((1,),)


def record(task, attempt=1, level=Level.FIRST, turns=1, turn_tokens=(), tool_tokens=0, thinking=0, answer=0):
    return AttemptRecord(task, 0, attempt, level, 1, 96_000, natural=True, thinking_tokens=thinking,
                         answer_tokens=answer, grid=G, turns=turns, turn_tokens=turn_tokens, tool_tokens=tool_tokens)


def test_turns_and_tokens_per_turn_are_learned_from_the_log():
    logged = [record("a", turns=2, turn_tokens=(600, 400), tool_tokens=100, thinking=900, answer=100),
              record("b", turns=2, turn_tokens=(800, 200), tool_tokens=300, thinking=900, answer=100),
              record("c", level=Level.SECOND, thinking=5_000, answer=100)]
    model = TurnModel.fit(logged)
    assert list(model.shares) == [2] and model.shares[2] == pytest.approx((0.7, 0.3))
    assert model.tool_turn == 200.0 and model.attempts == {2: 2}
    assert model.split(logged[0]) == ((600, 400), 100)  # a logged attempt keeps its own turns
    assert model.split(logged[2]) == ((), 0)  # one request
    # an older log's record: turns counted but not their tokens, split as the log's two-turn attempts were
    assert model.split(record("d", turns=2, thinking=1_900, answer=100)) == ((1_400, 600), 200)
    assert model.split(record("e", turns=3, thinking=2_900, answer=100)) == ((1_000, 1_000, 1_000), 200)  # evenly
    assert "2 turns x2: 70% / 30%" in model.summary() and "tool turn 200" in model.summary()
    back = AttemptRecord.from_json(logged[0].to_json())
    assert back == logged[0] and "turn_tokens" not in logged[2].to_json()  # one-request records stay as they were


def test_the_pool_hands_out_an_attempts_turns():
    pool = AttemptPool([record("a", turns=3, turn_tokens=(500, 300, 200), tool_tokens=80, thinking=900, answer=100)],
                       {("a", 0): G, ("z", 0): G})
    own = pool.draw(first_attempt("a"), random.Random(0))
    assert own.turns == (500, 300, 200) and own.tool_turn == 40 and own.tokens == 1_000
    made_up = pool.draw(first_attempt("z"), random.Random(0))  # an input with no log of its own draws the same shape
    assert made_up.turns == (500, 300, 200) and made_up.source == "pool"


def first_attempt(task):
    return Request(task, 0, 1, Level.FIRST, 96_000, 1)


def test_an_agent_attempt_runs_as_its_turns_one_after_another():
    """Each turn is submitted when the one before finishes, its prompt grown by the earlier turns and tool turns; the
    scheduler sees the attempt finish once, with the last turn."""
    prompt, turns, tool = 1_000, (100, 50, 30), 20
    submitted = []

    def draw(request, rng):
        if request.level is Level.FIRST:
            return SimAttempt(170, 10, prompt, True, G, True, 3, (G,), "test", turns, tool)
        return SimAttempt(170, 10, prompt, True, G, True, 3, (G,), "test")

    def duration(job):  # a second per thousand tokens prefilled or generated
        submitted.append((job.key, job.prompt, job.tokens))
        return (job.prompt + job.tokens) / 1_000

    config = ScheduleConfig(repair_caps=(), extra_min_left_s=10**6)
    result = simulate(config, [InputInfo("a", 0, prompt, 1)], draw, LatencyEngine(duration), {("a", 0): G}, 0)
    first = [(s, f) for r, _, s, f in result.finished if r.level is Level.FIRST]
    assert len(first) == 1
    assert submitted[:3] == [(("a", 0, 1, "turn", 0), 1_000, 100), (("a", 0, 1, "turn", 1), 1_120, 50),
                             (("a", 0, 1, "turn", 2), 1_190, 30)]
    start, end = first[0]
    assert abs(end - start - (1_100 + 1_170 + 1_220) / 1_000) < 1e-9  # three prefills, against 1.18 s as one request
    assert [key for key, _, _ in submitted[3:]] == [("a", 0, 2)]  # the second attempt: one request
    assert result.tokens_generated == 180 + 180


def test_the_simulator_scores_every_program_candidate_and_the_weak_pool():
    """The simulator selects with the solver's code: an agent attempt's every program candidate (Algorithm 7 line 16)
    and its weak pool count, as in the solver (submission.selection.Candidates)."""
    right, wrong, other = ((5,),), ((6,),), ((7,),)
    logged = [  # a: the second candidate is right; b: only the weak pool is; c: one request, as before
        AttemptRecord("a", 0, 1, Level.FIRST, 1, 96_000, natural=True, thinking_tokens=100, grid=other,
                      train_perfect=True, program_outputs=(wrong,), candidate_outputs=((wrong,), (right,)),
                      turns=2, turn_tokens=(60, 40)),
        AttemptRecord("b", 0, 1, Level.FIRST, 1, 96_000, natural=True, thinking_tokens=100, grid=other,
                      weak_outputs=(right,), turns=2, turn_tokens=(60, 40)),
        AttemptRecord("c", 0, 1, Level.FIRST, 1, 96_000, natural=True, thinking_tokens=100, grid=other,
                      train_perfect=True, program_outputs=(right,))]
    truth = {(k, 0): right for k in "abc"}
    pool = AttemptPool(logged, truth)
    config = ScheduleConfig(repair_caps=(), extra_min_left_s=10**6, cap_second=1)  # first attempts decide
    inputs = [InputInfo(k, 0, 100, 1) for k in "abc"]
    result = simulate(config, inputs, pool.draw, LatencyEngine(lambda job: 1.0), truth, 0)
    assert result.task_scores == {"a": 1.0, "b": 1.0, "c": 1.0}


def test_the_simulator_transfers_programs_only_where_the_profile_does():
    """A two-input task: input 0's train-perfect program is right on input 1 too, whose own grid is wrong. With
    transfer (the MoE profiles) input 1 is solved; without (dense-27b-4xL4, the 44.03 run) it is not."""
    right0, right1, wrong = ((5,),), ((6,),), ((7,),)
    logged = [
        AttemptRecord("t", 0, 1, Level.FIRST, 1, 96_000, natural=True, thinking_tokens=100, grid=right0,
                      train_perfect=True, program_outputs=(right0, right1)),
        AttemptRecord("t", 1, 1, Level.FIRST, 1, 96_000, natural=True, thinking_tokens=100, grid=wrong)]
    truth = {("t", 0): right0, ("t", 1): right1}
    config = ScheduleConfig(repair_caps=(), extra_min_left_s=10**6, cap_second=1)  # first attempts decide
    inputs = [InputInfo("t", i, 100, 2) for i in range(2)]
    scores = {transfer: simulate(config, inputs, AttemptPool(logged, truth).draw, LatencyEngine(lambda job: 1.0),
                                 truth, 0, transfer).task_scores["t"] for transfer in (True, False)}
    assert scores == {True: 1.0, False: 0.5}


def test_the_previews_share_without_room_for_a_second_check(arc_data):
    """The study's 172-input preview (Algorithm 7's 96K / 80K, 64K / 48K configuration) had 7 attempts without room for
    a second check (study ~3377-3380). Its numbers fix only this (sim.agent_turns' doc): every one of its budgets
    leaves 16,000 tokens after a first turn at its cap, and less the final turn's 4,000, the 1,000 a turn keeps and
    two responses at their 2,500 limit (~3435, ~3441-3442, ~3450), 6,000 for the first call and the reserves for a
    call and an answer: by the budget alone its 7 lost the second check only if those took more (reserves far above
    what a call and an answer usually take, e.g. the answer's limit), or its deadline cut the budget. It gives no
    first-turn lengths, no reserve sizes and no deadline for the preview, so the 7 cannot be replayed.
    The kit's reserves are the medians measured on ARC-AGI-2 evaluation (the call, the tool response, the final
    answer; the issue's "what the turns really take"). With them no first turn loses the second check by the budget
    or moe-4xL4's context, even at its cap with a call of answer_max_tokens and a response at its limit on the
    longest prompt: the replay of the example log (synthetic; one first attempt per test input, 167, at each task's
    own caps) gives 0, and so would any log; only the deadline can. With the reserves at their limits (the kit's
    arithmetic before), no room means a first turn at its cap: 53 of the example log's 167 (19 of its 75
    single-input first attempts reach 80K, 48 of its 92 multi-input ones 48K), where the study's 7 of 172 would allow
    about 4%."""
    from sim.agent_turns import (KIT_BEFORE, PREVIEW, PROFILE, PROGRAMS, STUDY_75K, FirstTurn, TurnSizes, first_turns,
                                 measure, no_room, preview, reserves, spare_at_cap)
    from submission.profiles import load
    from submission.reasoning.profile import EngineConfig
    from submission.tasks import load_tasks
    from submission.reasoning.tool_agent import ToolAgentConfig, first_cap, next_turn, request_limit

    for config in (PREVIEW, STUDY_75K):  # the study's arithmetic, from its numbers alone
        assert spare_at_cap(config, True) == spare_at_cap(config, False) == 6_000
    tasks = load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks
    programs = [p.read_text() for p in sorted(PROGRAMS.glob("*.py"))]
    shipped, engine = ToolAgentConfig(), load(PROFILE).engine
    assert reserves(measure(tasks, programs, shipped, EngineConfig().program_cue)) == (
        shipped.call_reserve, shipped.feedback_reserve, shipped.answer_reserve)
    firsts = first_turns(Path(__file__).parents[1] / "sim" / "data" / "example_attempts.jsonl", tasks, programs,
                         shipped, load(PROFILE).prompt, EngineConfig().program_cue)
    assert len(firsts) == 167 and sum(t.single for t in firsts) == 75
    longest = max(t.prompt for t in firsts)
    for config in (PREVIEW, STUDY_75K):
        for single in (True, False):  # the worst a first turn can leave, on the longest prompt: room still
            worst = TurnSizes(engine.answer_max_tokens, config.feedback_max_tokens, 0)
            assert not no_room(config, engine, FirstTurn(single, longest, 10 ** 6, worst))
            assert no_room(config, engine, FirstTurn(single, 60_000, 10 ** 6, worst))  # the context takes it
        assert preview(config, engine, firsts) == 0
        before = ToolAgentConfig(**{**config.__dict__, **KIT_BEFORE})
        lost = [t for t in firsts if no_room(before, engine, t)]
        capped = [t for t in firsts if t.thinking >= first_cap(config, t.single)]
        assert len(lost) > 7 and set(map(id, lost)) <= set(map(id, capped))
    assert len(lost) == 60 and preview(ToolAgentConfig(**{**PREVIEW.__dict__, **KIT_BEFORE}), engine, firsts) == 53
    # The deadline can: moe-4xL4's cap formula (8 tokens/s, 240 s, 3,000) leaves no second check to a first check that
    # ends within ~22.5 minutes (1,352 s) of the hard stop, as the solver computes the next turn's limit.
    profile = load(PROFILE)
    used = profile.tool_agent.first_thinking + 26 + 713  # a first turn at its cap, the median call and response
    for before_stop, gone in ((1_400, False), (1_300, True)):
        deadline = profile.schedule.cap(10 ** 9, profile.schedule.hard_stop - before_stop)
        limit = request_limit(deadline, engine.max_model_len, 5_000 + used, engine.answer_max_tokens)
        assert next_turn(profile.tool_agent, 1, used, True, limit)[1] is gone
