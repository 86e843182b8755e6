"""The schedule's policy on a simulated clock: deadlines, levels, promotion, follow-ups and caps."""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from sim.pool import SimAttempt
from sim.run import LatencyEngine, simulate
from sim.serving import Job
from submission.schedule import (Confidence, InputInfo, Level, Outcome, Request, ScheduleConfig, Scheduler, confidence,
                                 second_priority, stable_seed)

G1, G2 = ((1,),), ((2,),)


def inputs_for(rng: random.Random, n_tasks: int) -> list[InputInfo]:
    out = []
    for t in range(n_tasks):
        count = rng.choice([1, 1, 1, 2, 2, 3, 4])
        out += [InputInfo(f"t{t:03d}", i, rng.randint(500, 12_000), count) for i in range(count)]
    return out


def random_draw(config: ScheduleConfig, slow: float = 1.0):
    """Thinking lengths up to the cap (natural or forced) and a duration at the per-stream rate times a random factor
    up to `slow` (slow > 1: streams slower than the rate the caps assume)."""
    factors = {}

    def draw(request: Request, rng: random.Random) -> SimAttempt:
        thinking = rng.randint(1_000, request.cap) if rng.random() < 0.7 else request.cap
        natural = thinking < request.cap
        grid = rng.choice([G1, G2, None]) if natural else rng.choice([G1, None])
        factors[request.key + (request.attempt,)] = rng.uniform(0.2, slow)
        return SimAttempt(thinking, rng.randint(50, 3_000), 1000, natural, grid, rng.random() < 0.05,
                          rng.randint(0, 3), (), "test")

    def duration(job: Job) -> float:
        return job.tokens / config.rate_tok_s * factors[job.key]

    return draw, duration


def run(config: ScheduleConfig, inputs: list[InputInfo], rng: random.Random, slow: float = 1.0):
    draw, duration = random_draw(config, slow)
    truth = {i.key: G1 for i in inputs}
    return simulate(config, inputs, draw, LatencyEngine(duration), truth, rng)


@pytest.mark.parametrize("slow", [1.0, 3.0])
def test_no_request_after_the_stop_margin_and_the_run_ends_by_the_hard_stop(slow):
    for seed in range(40):
        rng = random.Random(seed)
        config = ScheduleConfig(max_in_flight=rng.choice([4, 16, 56]), rate_tok_s=rng.choice([8.0, 15.0, 200.0]))
        result = run(config, inputs_for(rng, 240), rng, slow)
        assert all(start <= config.stop_new for start, _ in result.started)
        assert result.end_s <= config.hard_stop
        assert all(config.min_cap <= r.cap for _, r in result.started)
        for start, r in result.started:
            assert r.cap <= config.rate_tok_s * (config.hard_stop - start - config.cap_margin_s) - config.cap_margin_tokens
        if slow == 1.0:  # streams as fast as the caps assume (answers under 3,000 tokens): nothing is cut off
            assert not result.aborted


def test_in_flight_bound():
    rng = random.Random(3)
    config = ScheduleConfig(max_in_flight=5)
    scheduler = Scheduler(config, inputs_for(rng, 30))
    running = []
    for _ in range(10):
        while (request := scheduler.next(0.0)) is not None:
            running.append(request)
        assert len(scheduler.in_flight) <= 5
        scheduler.on_finished(1.0, outcome(running.pop(0)))


def test_unlimited_throughput_gives_every_input_both_attempts():
    rng = random.Random(7)
    config = ScheduleConfig(rate_tok_s=1e9, max_in_flight=8)
    inputs = inputs_for(rng, 80)
    result = run(config, inputs, rng)
    levels: dict = {}
    for request, _, _, _ in result.finished:
        levels.setdefault(request.key, set()).add(request.level)
    assert len(levels) == len(inputs)
    assert all({Level.FIRST, Level.SECOND} <= got for got in levels.values())


def outcome(request: Request, natural=True, grid=G1, thinking=10_000, perfect=False, demos=0) -> Outcome:
    return Outcome(request.task_id, request.test_index, request.attempt, request.level, natural, grid, thinking,
                   perfect, demos)


def drain(scheduler: Scheduler, now: float = 0.0) -> list[Request]:
    out = []
    while (request := scheduler.next(now)) is not None:
        out.append(request)
    return out


def test_first_attempts_go_first_shortest_prompt_first():
    infos = [InputInfo("long", 0, 9_000, 2), InputInfo("long", 1, 9_500, 2), InputInfo("short", 0, 1_000, 1)]
    scheduler = Scheduler(ScheduleConfig(max_in_flight=1), infos)
    first = scheduler.next(0.0)
    assert (first.task_id, first.level, first.cap) == ("short", Level.FIRST, 96_000)
    scheduler.on_finished(1.0, outcome(first, thinking=50_000))  # not promotable: thinking too long
    second = scheduler.next(1.0)
    assert (second.task_id, second.level, second.cap) == ("long", Level.FIRST, 64_000)


def test_promotion_puts_a_quick_natural_second_attempt_before_unstarted_first_attempts():
    infos = [InputInfo("a", 0, 1_000, 1), InputInfo("b", 0, 2_000, 1), InputInfo("c", 0, 3_000, 1)]
    scheduler = Scheduler(ScheduleConfig(max_in_flight=1), infos)
    a1 = scheduler.next(0.0)
    scheduler.on_finished(1.0, outcome(a1, natural=True, thinking=20_000))
    a2 = scheduler.next(1.0)
    assert (a2.task_id, a2.level, a2.attempt) == ("a", Level.SECOND, 2)


@pytest.mark.parametrize("change", [dict(natural=False), dict(grid=None), dict(thinking=45_000),
                                    dict(perfect=True)])
def test_no_promotion_otherwise(change):
    infos = [InputInfo("a", 0, 1_000, 1), InputInfo("b", 0, 2_000, 1)]
    scheduler = Scheduler(ScheduleConfig(max_in_flight=1), infos)
    a1 = scheduler.next(0.0)
    scheduler.on_finished(1.0, outcome(a1, **change))
    assert scheduler.next(1.0).task_id == "b"


def test_multi_input_tasks_are_never_promoted():
    infos = [InputInfo("a", 0, 1_000, 2), InputInfo("a", 1, 1_100, 2), InputInfo("b", 0, 2_000, 1)]
    scheduler = Scheduler(ScheduleConfig(max_in_flight=1), infos)
    a1 = scheduler.next(0.0)
    scheduler.on_finished(1.0, outcome(a1, thinking=1_000))
    assert scheduler.next(1.0).level is Level.FIRST


def both_attempts(scheduler: Scheduler, first: dict, second: dict) -> None:
    r1 = scheduler.next(0.0)
    scheduler.on_finished(1.0, outcome(r1, **first))
    r2 = scheduler.next(1.0)
    assert r2.level is Level.SECOND
    scheduler.on_finished(2.0, outcome(r2, **second))


def test_repair_then_extra_when_no_program_is_perfect_and_grids_differ():
    scheduler = Scheduler(ScheduleConfig(max_in_flight=1), [InputInfo("a", 0, 1_000, 1)])
    both_attempts(scheduler, dict(grid=G1, demos=1, thinking=50_000), dict(grid=G2, demos=0))
    repair = scheduler.next(3.0)
    assert (repair.level, repair.repair_turn, repair.cap) == (Level.REPAIR, 1, 24_000)
    scheduler.on_finished(4.0, outcome(repair, demos=2))
    repair2 = scheduler.next(4.0)
    assert (repair2.level, repair2.repair_turn, repair2.cap) == (Level.REPAIR, 2, 16_000)
    scheduler.on_finished(5.0, outcome(repair2, demos=2))
    extra = scheduler.next(5.0)
    assert (extra.level, extra.cap) == (Level.EXTRA, 32_000)
    scheduler.on_finished(6.0, outcome(extra))
    assert scheduler.next(6.0) is None and not scheduler.in_flight


@pytest.mark.parametrize("first, second", [
    (dict(grid=G1, demos=0), dict(grid=G1, demos=0)),  # nothing reproduces a demonstration, grids agree
    (dict(grid=G1, demos=3, perfect=True, thinking=50_000), dict(grid=G2, demos=1)),  # a perfect program exists
])
def test_no_followups(first, second):
    scheduler = Scheduler(ScheduleConfig(max_in_flight=1), [InputInfo("a", 0, 1_000, 1)])
    both_attempts(scheduler, first, second)
    assert scheduler.next(3.0) is None


def test_followups_respect_their_time_gates():
    config = ScheduleConfig(max_in_flight=1)
    scheduler = Scheduler(config, [InputInfo("a", 0, 1_000, 1)])
    both_attempts(scheduler, dict(grid=G1, demos=1, thinking=50_000), dict(grid=G2))
    late = config.hard_stop - config.repair_min_left_s + 1  # too late for repair and extra
    assert scheduler.next(late) is None
    between = config.hard_stop - config.extra_min_left_s + 1  # repair allowed, extra not
    assert scheduler.next(between).level is Level.REPAIR


def test_caps_shrink_near_the_end_and_tiny_caps_are_skipped():
    config = ScheduleConfig(max_in_flight=4)
    infos = [InputInfo(t, 0, 1_000, 1) for t in "abcd"]
    scheduler = Scheduler(config, infos)
    now = config.hard_stop - config.cap_margin_s - (10_000 + config.cap_margin_tokens) / config.rate_tok_s
    request = scheduler.next(now)
    assert request.cap == 10_000
    too_late = config.hard_stop - config.cap_margin_s - (3_999 + config.cap_margin_tokens) / config.rate_tok_s
    assert scheduler.next(min(too_late, config.stop_new)) is None
    assert len(scheduler.skipped) == 3 and all(s.cap < 4_000 for s in scheduler.skipped)


def test_stable_seeds():
    assert stable_seed("abc", 0, 1) == stable_seed("abc", 0, 1) != stable_seed("abc", 0, 2)
    assert stable_seed("abc", 0, 1) == 979831218  # sha256("abc/0/1/"), fixed across machines and Python versions


def test_bad_config_is_refused():
    with pytest.raises(ValueError, match="hard_stop_margin_s"):
        ScheduleConfig(hard_stop_margin_s=1000, stop_new_margin_s=900)
    with pytest.raises(ValueError, match="duplicate"):
        Scheduler(ScheduleConfig(), [InputInfo("a", 0, 1, 1)] * 2)
    assert replace(ScheduleConfig(), rate_tok_s=15.0).rate_tok_s == 15.0


def test_a_failed_request_is_retried_once_then_counts_as_finished():
    scheduler = Scheduler(ScheduleConfig(max_in_flight=1), [InputInfo("a", 0, 1_000, 1), InputInfo("b", 0, 2_000, 1)])
    first = scheduler.next(0.0)
    assert scheduler.on_failed(1.0, first) is True
    again = scheduler.next(1.0)
    assert (again.task_id, again.level, again.attempt) == ("a", Level.FIRST, 2)  # head of its level, new number
    assert scheduler.on_failed(2.0, again) is False  # the second failure: finished without an answer
    follow = scheduler.next(2.0)
    assert follow.task_id == "b" and follow.level is Level.FIRST
    scheduler.on_finished(3.0, outcome(follow, thinking=50_000))
    levels = sorted((r.task_id, r.level) for r in drain_all(scheduler))
    assert ("a", Level.SECOND) in levels  # the input moved on to its second attempt


def drain_all(scheduler: Scheduler) -> list[Request]:
    out = []
    while (request := scheduler.next(4.0)) is not None:
        out.append(request)
        scheduler.on_finished(4.0, outcome(request, thinking=50_000))
    return out


def test_a_time_limit_inside_the_margins_is_refused_with_the_numbers():
    with pytest.raises(ValueError, match=r"time_limit_s 240 s .*stop_new_margin_s \(900 s\).*\(420 \+ 240 s\)"):
        replace(ScheduleConfig(), time_limit_s=240)
    with pytest.raises(ValueError, match=r"time_limit_s 600 s"):  # beyond the stop margin, inside hard stop + cap
        ScheduleConfig(time_limit_s=600, hard_stop_margin_s=420, stop_new_margin_s=500, cap_margin_s=240)
    assert ScheduleConfig(time_limit_s=901).stop_new == 1.0


def test_a_profile_with_a_limit_inside_its_margins_is_refused_naming_the_file(tmp_path):
    from submission.profiles import ProfileError, load_profile

    path = tmp_path / "short.toml"
    path.write_text("[schedule]\ntime_limit_s = 600.0\n")  # the MoE margins: 7 and 15 minutes
    with pytest.raises(ProfileError, match=r"short.toml.schedule: schedule: time_limit_s 600 s .*\(900 s\)"):
        load_profile(path)


@pytest.mark.parametrize("limit", [900.0, 1800.0])
def test_a_scaled_schedule_is_the_full_one_in_miniature(limit):
    """The commit run's rehearsal (issue 12): the MoE schedule scaled to a short limit makes a first attempt for every
    input, even when the engine takes a third of the limit to start, and each (thinking at the schedule's rate, then
    cap_margin_tokens of answer) fits before the hard stop; margins and level caps shrink in proportion."""
    full = ScheduleConfig()
    small = full.scaled(limit)
    f = limit / full.time_limit_s
    assert (small.time_limit_s, small.hard_stop, small.stop_new) == pytest.approx(
        (limit, full.hard_stop * f, full.stop_new * f))
    assert (small.repair_min_left_s, small.extra_min_left_s, small.cap_margin_s) == pytest.approx(
        (full.repair_min_left_s * f, full.extra_min_left_s * f, full.cap_margin_s * f))
    assert small.min_cap == round(full.min_cap * f) and small.repair_caps == tuple(round(c * f) for c in
                                                                                    full.repair_caps)
    assert (small.cap_first_single, small.cap_second) == (round(96_000 * f), round(48_000 * f))
    assert small.cap_margin_tokens == round(full.cap_margin_tokens * f)
    inputs = [InputInfo(f"t{i}", j, 3_000 + 100 * i, 2 if i == 2 else 1) for i in range(3) for j in
              range(2 if i == 2 else 1)]
    scheduler = Scheduler(small, inputs)
    started = limit / 3
    requests = drain(scheduler, started)
    assert sorted((r.key, r.level) for r in requests) == sorted((i.key, Level.FIRST) for i in inputs)
    assert all(small.min_cap <= r.cap and started + (r.cap + small.cap_margin_tokens) / small.rate_tok_s
               < small.hard_stop for r in requests)
    assert drain(Scheduler(replace(full, time_limit_s=full.stop_new_margin_s + 1), inputs), 0.0) == []  # unscaled


REHEARSAL_S = 1800.0  # boot's --rehearsal-deadline, engine start included


@pytest.mark.parametrize("name", ["moe-4xL4", "moe-4xL4-direct", "dense-27b-4xL4", "both-4xL4"])
def test_a_rehearsal_whose_engine_starts_late_still_makes_first_attempts(name):
    """Issue 27: moe-4xL4 scaled to the 1,800-s rehearsal, with the engine ready at ~1,370 s as seen on the box.
    Unscaled, cap_margin_tokens (3,000) alone left 8 x (1,775 - 1,370 - 10) - 3,000 = 160 tokens, under the scaled
    min_cap of 167: every input was skipped and the rehearsal failed where the 12-hour run would have worked."""
    from submission.profiles import line_configs, load_both_profile, load_profile, profile_line

    if profile_line(name) == "both":
        schedule = line_configs(load_both_profile(name), REHEARSAL_S, scale=True)[0].schedule
    else:
        schedule = load_profile(name).schedule.scaled(REHEARSAL_S)
    inputs = [InputInfo("00576224", 0, 1_400, 1), InputInfo("007bbfb7", 0, 2_900, 1),
              InputInfo("009d5c81", 0, 6_100, 2), InputInfo("009d5c81", 1, 6_300, 2)]
    scheduler = Scheduler(schedule, inputs)
    first = scheduler.next(1370.0)
    assert scheduler.skipped == [] and first is not None and first.level is Level.FIRST
    assert schedule.min_cap <= first.cap <= schedule.cap_first_single
    assert sorted(r.key for r in [first] + drain(scheduler, 1370.0)) == sorted(i.key for i in inputs)


def second_order(config: ScheduleConfig, infos: list[InputInfo], firsts: dict[str, dict]) -> list[str]:
    """Finish every first attempt (in the order of `firsts`, keyed by task) and return the order in which the second
    attempts then start."""
    scheduler = Scheduler(replace(config, max_in_flight=len(infos)), infos)
    started = {r.task_id: r for r in drain(scheduler)}
    for task_id, change in firsts.items():
        scheduler.on_finished(1.0, outcome(started[task_id], **change))
    seconds = []
    while (request := scheduler.next(2.0)) is not None:
        assert request.level is Level.SECOND
        seconds.append(request.task_id)
        scheduler.on_finished(2.0, outcome(request))
    return seconds


# Finished in this order (first in, first out would run them so); none is promotable (thinking >= 40K or multi-input).
FIRSTS = {
    "forced": dict(natural=False, grid=G1, thinking=96_000),
    "multi-natural": dict(thinking=1_000),
    "verified": dict(perfect=True, demos=3, thinking=60_000),
    "natural-long": dict(thinking=70_000),
    "no-grid": dict(grid=None, thinking=41_000),
    "natural-short": dict(thinking=45_000),
}


def firsts_infos() -> list[InputInfo]:
    return [InputInfo(t, 0, 1_000 + i, 2 if t.startswith("multi") else 1) for i, t in enumerate(FIRSTS)]


def test_second_attempts_run_in_the_study_order():
    assert second_order(ScheduleConfig(), firsts_infos(), FIRSTS) == [
        "natural-short", "natural-long", "verified", "no-grid", "forced", "multi-natural"]


def test_fifo_second_attempts_when_the_profile_asks():
    assert second_order(ScheduleConfig(second_by_confidence=False), firsts_infos(), FIRSTS) == list(FIRSTS)


def test_a_task_made_perfect_by_another_input_is_verified():
    # the multi-input task's input 1 finds a train-perfect program first: input 0's natural attempt is then VERIFIED,
    # and sorts after the other multi-input task's natural attempt despite its shorter thinking.
    infos = [InputInfo("m", 0, 1_000, 2), InputInfo("m", 1, 1_001, 2), InputInfo("n", 0, 1_002, 2)]
    scheduler = Scheduler(ScheduleConfig(max_in_flight=3), infos)
    started = {r.key: r for r in drain(scheduler)}
    scheduler.on_finished(1.0, outcome(started[("m", 1)], perfect=True, demos=3, thinking=30_000))
    scheduler.on_finished(1.0, outcome(started[("m", 0)], thinking=10_000))
    scheduler.on_finished(1.0, outcome(started[("n", 0)], thinking=20_000))
    assert [r.key for r in drain(scheduler, 2.0)] == [("n", 0), ("m", 0), ("m", 1)]


@pytest.mark.parametrize("change, klass", [
    (dict(), Confidence.NATURAL), (dict(perfect=True), Confidence.VERIFIED), (dict(natural=False), Confidence.FORCED),
    (dict(grid=None), Confidence.FORCED), (dict(natural=False, perfect=True), Confidence.VERIFIED)])
def test_confidence_classes(change, klass):
    request = Request("a", 0, 1, Level.FIRST, 96_000, 0)
    assert confidence(outcome(request, **change), task_perfect=False) is klass
    assert confidence(outcome(request, **change), task_perfect=True) is Confidence.VERIFIED
    assert second_priority(outcome(request, **change), 1, False) == (0, int(klass), 10_000)
    assert second_priority(outcome(request, **change), 3, False)[0] == 1
