"""The scored runs' procedures, by behaviour (issue 28): each shipped profile's schedule is driven with scripted
outcomes on a fake clock, and the tests read the order in which it hands out requests, the prompt its runs send and
the engine arguments they set. The study's passages are cited as "study ~N" (../shared/design/STUDY.md)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from submission.reasoning.engines.base import GenerationRequest
from submission.reasoning.engines.vllm import engine_kwargs, sampling_kwargs
from submission.profiles import load_profile
from submission.reasoning.prompt import task_text
from submission.schedule import InputInfo, Level, Outcome, Request, Scheduler
from submission.selection import Candidates
from submission.tasks import Pair, Task

G1, G2 = ((1,),), ((2,),)
MOE = ("moe-4xL4", "moe-4xL4-direct")


def schedule_of(profile: str, **changes):
    return replace(load_profile(profile).schedule, **changes)


def finish(scheduler: Scheduler, now: float, request: Request, natural=True, grid=G1, thinking=10_000,
           perfect=False, demos=0) -> None:
    scheduler.on_finished(now, Outcome(request.task_id, request.test_index, request.attempt, request.level, natural,
                                       grid, thinking, perfect, demos))


def drain(scheduler: Scheduler, now: float) -> list[Request]:
    out = []
    while (request := scheduler.next(now)) is not None:
        out.append(request)
    return out


# The MoE runs: the repair turn is queued when attempt 1 finishes (study ~4492-4496).

@pytest.mark.parametrize("profile", MOE)
def test_moe_repair_is_queued_after_attempt_1_not_after_both(profile):
    scheduler = Scheduler(schedule_of(profile), [InputInfo("a", 0, 1_000, 1)])
    first = scheduler.next(0.0)
    finish(scheduler, 1.0, first, thinking=50_000, demos=1)
    second, repair = drain(scheduler, 1.0)  # attempt 2 still running: the repair does not wait for it
    assert (second.level, repair.level, repair.repair_turn, repair.cap) == (Level.SECOND, Level.REPAIR, 1, 16_000)


@pytest.mark.parametrize("profile", MOE)
@pytest.mark.parametrize("change", [dict(demos=0), dict(demos=3, perfect=True)])
def test_moe_repair_needs_a_program_that_reproduces_a_demonstration_and_none_train_perfect(profile, change):
    scheduler = Scheduler(schedule_of(profile), [InputInfo("a", 0, 1_000, 1)])
    finish(scheduler, 1.0, scheduler.next(0.0), thinking=50_000, **change)
    second = drain(scheduler, 1.0)
    finish(scheduler, 2.0, second[0], grid=G1, demos=1)  # attempt 2's program does not queue one: attempt 1's does
    assert [r.level for r in second] == [Level.SECOND] and drain(scheduler, 2.0) == []


@pytest.mark.parametrize("profile", MOE)
def test_moe_repair_starts_only_45_minutes_before_the_hard_stop(profile):
    config = schedule_of(profile)
    scheduler = Scheduler(config, [InputInfo("a", 0, 1_000, 1)])
    finish(scheduler, 1.0, scheduler.next(0.0), thinking=50_000, demos=1)
    assert scheduler.next(1.0).level is Level.SECOND
    assert config.repair_min_left_s == 45 * 60
    assert scheduler.next(config.hard_stop - config.repair_min_left_s + 1) is None
    assert scheduler.next(config.hard_stop - config.repair_min_left_s).level is Level.REPAIR


# The MoE runs: second attempts by confidence class, then thinking length, single-input tasks first (study ~3352-3354).

@pytest.mark.parametrize("profile", MOE)
def test_moe_second_attempts_run_in_confidence_order(profile):
    names = ["forced", "verified", "natural-long", "natural-short", "multi"]
    inputs = [InputInfo(name, 0, 1_000 + i, 2 if name == "multi" else 1) for i, name in enumerate(names)]
    inputs.append(InputInfo("multi", 1, 9_000, 2))
    scheduler = Scheduler(schedule_of(profile), inputs)
    firsts = {r.key: r for r in drain(scheduler, 0.0)}
    assert all(r.level is Level.FIRST for r in firsts.values()) and len(firsts) == 6
    scripted = {"forced": dict(natural=False, thinking=90_000), "verified": dict(perfect=True, demos=3),
                "natural-long": dict(thinking=48_000), "natural-short": dict(thinking=41_000),
                "multi": dict(thinking=1_000)}  # over the promotion threshold: none goes early
    for t, (key, request) in enumerate(firsts.items()):
        finish(scheduler, 1.0 + t, request, **scripted[key[0]])
    seconds = drain(scheduler, 10.0)
    assert [r.task_id for r in seconds] == ["natural-short", "natural-long", "verified", "forced", "multi", "multi"]
    assert all(r.level is Level.SECOND for r in seconds)


@pytest.mark.parametrize("profile", MOE)
def test_moe_promotes_a_quick_natural_second_attempt(profile):
    scheduler = Scheduler(schedule_of(profile, max_in_flight=1), [InputInfo(t, 0, 1_000 + i, 1)
                                                                 for i, t in enumerate("abc")])
    finish(scheduler, 1.0, scheduler.next(0.0), thinking=39_999)
    promoted = scheduler.next(1.0)
    assert (promoted.task_id, promoted.level) == ("a", Level.SECOND)


# The extra attempt: once both attempts are in, no program train-perfect, the two grids differ, >= 50 min left
# (study ~4496-4498; Algorithm 5 line 1 for the dense run, 35 min).

@pytest.mark.parametrize("profile, cap, left", [("moe-4xL4", 48_000, 50 * 60), ("moe-4xL4-direct", 48_000, 50 * 60),
                                                ("dense-27b-4xL4", 32_000, 35 * 60)])
def test_the_extra_attempt_comes_once_both_grids_differ_and_only_in_time(profile, cap, left):
    config = schedule_of(profile, max_in_flight=1)
    scheduler = Scheduler(config, [InputInfo("a", 0, 1_000, 1)])
    finish(scheduler, 1.0, scheduler.next(0.0), grid=G1, thinking=50_000)
    assert scheduler.next(1.0).level is Level.SECOND  # not the extra: attempt 2 is not in
    finish(scheduler, 2.0, scheduler.in_flight[("a", 0, 2)], grid=G2)
    assert config.extra_min_left_s == left
    assert scheduler.next(config.hard_stop - left + 1) is None
    extra = scheduler.next(config.hard_stop - left - 3 * 3600)
    assert (extra.level, extra.attempt, extra.cap) == (Level.EXTRA, 3, cap)


@pytest.mark.parametrize("profile", ["moe-4xL4", "moe-4xL4-direct", "dense-27b-4xL4"])
@pytest.mark.parametrize("first, second", [(dict(grid=G1), dict(grid=G1)),  # the grids agree
                                           (dict(grid=G1), dict(grid=None)),  # attempt 2 has none
                                           (dict(grid=G1), dict(grid=G2, perfect=True, demos=3))])  # a verified
def test_no_extra_attempt_otherwise(profile, first, second):
    scheduler = Scheduler(schedule_of(profile, max_in_flight=1), [InputInfo("a", 0, 1_000, 1)])
    finish(scheduler, 1.0, scheduler.next(0.0), thinking=50_000, **first)
    finish(scheduler, 2.0, scheduler.next(1.0), **second)
    assert scheduler.next(3.0) is None


# The dense 27B, the 44.03 run (Algorithm 5, study ~2484-2500; ~2327-2330).

def dense_run(max_in_flight: int):
    """Six single-input tasks whose attempts all end quickly and naturally with a grid (each would be promoted under
    the MoE rule), run to the end; attempt 1 of the odd ones is forced. The order requests started in."""
    config = schedule_of("dense-27b-4xL4", max_in_flight=max_in_flight)
    lengths = [5_000, 1_000, 3_000, 6_000, 2_000, 4_000]
    scheduler = Scheduler(config, [InputInfo(f"t{i}", 0, n, 1) for i, n in enumerate(lengths)])
    started, now = [], 0.0
    while True:
        batch = drain(scheduler, now)
        started += batch
        if not scheduler.in_flight:
            return started
        request = min(scheduler.in_flight.values(), key=lambda r: (r.task_id, r.attempt))
        now += 60.0
        forced = request.level is Level.FIRST and int(request.task_id[1]) % 2 == 1
        finish(scheduler, now, request, natural=not forced, thinking=request.cap if forced else 2_000)


@pytest.mark.parametrize("max_in_flight", [1, 3])
def test_dense_every_first_attempt_starts_before_any_second_in_prompt_length_order(max_in_flight):
    started = dense_run(max_in_flight)
    levels = [r.level for r in started]
    assert levels == [Level.FIRST] * 6 + [Level.SECOND] * 6  # no promotion; no repair (no program reproduced one)
    assert [r.task_id for r in started[:6]] == ["t1", "t4", "t2", "t5", "t0", "t3"]  # shortest prompt first


def test_dense_second_attempts_are_a_plain_queue():
    """In the order their first attempts finished, whatever the confidence class (forced ones are not last)."""
    started = dense_run(1)
    assert [r.task_id for r in started[6:]] == [r.task_id for r in started[:6]]


def test_dense_repair_waits_for_both_attempts():
    scheduler = Scheduler(schedule_of("dense-27b-4xL4"), [InputInfo("a", 0, 1_000, 1)])
    finish(scheduler, 1.0, scheduler.next(0.0), thinking=50_000, demos=1)
    (second,) = drain(scheduler, 1.0)
    finish(scheduler, 2.0, second, grid=G1)
    repair = scheduler.next(2.0)
    assert (repair.level, repair.repair_turn, repair.cap) == (Level.REPAIR, 1, 24_000)
    finish(scheduler, 3.0, repair, demos=1)
    assert scheduler.next(3.0).cap == 16_000  # then 16K unless a program is now train-perfect


@pytest.mark.parametrize("profile", ("dense-27b-4xL4",) + MOE)
def test_repair_needs_a_plain_view_program_that_reproduces_a_demonstration(profile):
    """Algorithm 5 L2 (study ~2491-2492) and the MoE runs (~4493-4495): the repair turn is queued only when a
    plain-view program reproduces a demonstration. The second attempt's program (reordered demonstrations) does not
    count, even when it reproduces more of them than the first's."""
    for first_demos, second_demos, queued in ((0, 2, False), (1, 0, True), (1, 2, True)):
        scheduler = Scheduler(schedule_of(profile, promote_below_thinking=0), [InputInfo("a", 0, 1_000, 1)])
        finish(scheduler, 1.0, scheduler.next(0.0), thinking=50_000, demos=first_demos)
        started = drain(scheduler, 1.0)
        second = next(r for r in started if r.level is Level.SECOND)
        finish(scheduler, 2.0, second, grid=G1, demos=second_demos)
        levels = [r.level for r in started + drain(scheduler, 2.0)]
        assert (Level.REPAIR in levels) is queued, (first_demos, second_demos)


@pytest.mark.parametrize("profile, transferred", [("dense-27b-4xL4", False), ("moe-4xL4", True),
                                                   ("moe-4xL4-direct", True)])
def test_program_transfer_came_with_the_moe_53_33_run(profile, transferred):
    """A train-perfect program of one test input answers the task's other inputs only from the 53.33 run on (study
    ~3344-3346, runs table ~3510): the dense 44.03 run's second input keeps its own grids."""
    candidates = Candidates(transfer=load_profile(profile).selection.transfer)
    candidates.add("t", 0, 1, G1, ((G1, G2),))  # input 0's attempt: its program gives G2 for input 1
    candidates.add("t", 1, 1, ((3,),), ())
    assert candidates.answers(("t", 1)) == ((G2, ((3,),)) if transferred else (((3,),), ((0,),)))


def test_dense_promotion_stays_off_in_a_scaled_schedule():
    config = load_profile("dense-27b-4xL4").schedule.scaled(1800.0)
    assert config.promote_below_thinking == 0
    scheduler = Scheduler(replace(config, max_in_flight=1), [InputInfo("a", 0, 1_000, 1), InputInfo("b", 0, 2_000, 1)])
    finish(scheduler, 1.0, scheduler.next(0.0), thinking=0)
    assert scheduler.next(1.0).task_id == "b"


def test_dense_answer_tokens_are_sampled_at_the_thinking_temperature():
    """The x2 answer scaling came with the MoE 53.33 run (study ~3341, ~3510); the 44.03 run states none."""
    request = GenerationRequest("t/0/1", (1, 2, 3), thinking_cap=1000, seed=3)

    def scale(profile: str) -> float:  # the vLLM engine divides the logits after </think> by it
        kwargs = sampling_kwargs(load_profile(profile).engine, request, 20, 'root ::= "x"', 7, [])
        return kwargs["extra_args"]["answer_scale"]

    assert scale("dense-27b-4xL4") == 1.0 and scale("moe-4xL4-direct") == 0.5


TASK = Task("t", (Pair(((1, 2), (3, 4)), ((4, 3), (2, 1))),), (((5, 6, 7),),), (((7, 6, 5),),))


def test_dense_prompt_has_json_grids_and_the_moe_prompt_rows_with_sizes():
    """RFT v1's traces used JSON grids (study ~1925-1926); the row-wise prompt came with the MoE 53.33 run (~3510)."""
    dense = task_text(TASK, 0, load_profile("dense-27b-4xL4").prompt)
    assert "Input:\n[[1, 2], [3, 4]]\nOutput:\n[[4, 3], [2, 1]]" in dense and dense.endswith("Test input:\n[[5, 6, 7]]")
    moe = task_text(TASK, 0, load_profile("moe-4xL4-direct").prompt)
    assert "Input:\n2x2\n1 2\n3 4\nOutput:\n2x2\n4 3\n2 1" in moe and moe.endswith("Test input:\n1x3\n5 6 7")


def test_rft_rows_and_inference_share_the_dense_prompt(tmp_path):
    """training.dataset re-renders each trace's prompt with the profile's [prompt] it is given: a trace sampled with
    the dense profile's JSON prompt becomes a row under that profile and is refused under a row-wise one."""
    pytest.importorskip("transformers", reason="rows need a tokenizer (make engine-env)")
    from build.models.tiny import make_tokenizer
    from submission.reasoning.profile import PromptConfig
    from submission.reasoning.prompt import render
    from training.dataset import PromptMismatch, rows_from_traces
    from training.traces import known_trace

    tokenizer = make_tokenizer(tmp_path / "tok")
    profile = load_profile("dense-27b-4xL4")
    prompt = render(tokenizer, TASK, 0, profile.prompt)[1]
    assert "[[1, 2], [3, 4]]" in tokenizer.decode(prompt)
    trace = known_trace(tokenizer, TASK, 0, prompt, profile.engine.program_cue)
    label = [list(r) for r in TASK.test_outputs[0]]
    record = {"task_id": TASK.id, "test_index": 0, "split": "training", "prompt_ids": prompt,
              "completion_ids": trace["token_ids"], "text": tokenizer.decode(trace["token_ids"]), "natural": True,
              "grid": label, "label": label}
    rows, _ = rows_from_traces([record], {TASK.id: TASK}, tokenizer, profile.prompt)
    assert rows[0].input_ids[:len(prompt)] == prompt
    with pytest.raises(PromptMismatch):
        rows_from_traces([record], {TASK.id: TASK}, tokenizer, PromptConfig(grid_format="rows"))


def test_moe_direct_uses_the_engines_default_draft_acceptance():
    """Probabilistic draft sampling came with the 54.44 run (study ~3389-3390, ~3518-3519), after the 53.33 run."""
    args = engine_kwargs("m", load_profile("moe-4xL4-direct").engine, "</think>", False, True)
    assert args["speculative_config"]["draft_sample_method"] == "greedy"  # vLLM 0.33's default
    args = engine_kwargs("m", load_profile("moe-4xL4").engine, "</think>", False, True)
    assert args["speculative_config"]["draft_sample_method"] == "probabilistic"


@pytest.mark.parametrize("profile, sharded, local_argmax", [
    ("dense-27b-4xL4", True, True), ("moe-4xL4", False, False), ("moe-4xL4-direct", False, False)])
def test_the_dense_run_sets_its_two_decode_speed_ups(profile, sharded, local_argmax):
    """The 44.03 run added batch-sharded sampling and local-argmax draft reduction (study ~2296-2298); the engine
    hands them to vLLM 0.33 as enable_batch_sharded_sampling and speculative_config.use_local_argmax_reduction (names
    checked against its source: tests/test_vllm_v2.py). The MoE profiles set neither (their tables say why)."""
    args = engine_kwargs("m", load_profile(profile).engine, "</think>", False, True)
    assert args.get("enable_batch_sharded_sampling", False) is sharded
    assert args["speculative_config"].get("use_local_argmax_reduction", False) is local_argmax


@pytest.mark.parametrize("key, value, message", [
    ("repair_after", "never", "repair_after must be one of first, both"),
    ("promote_below_thinking", -1, "promote_below_thinking must be 0"),
])
def test_bad_schedule_values_are_refused_with_the_key(tmp_path, key, value, message):
    from submission.profiles import ProfileError

    path = tmp_path / "bad.toml"
    path.write_text(f"[schedule]\n{key} = {value!r}\n".replace("'", '"'))
    with pytest.raises(ProfileError, match=f"{path}.*{message}"):
        load_profile(path)


def test_a_bad_grid_format_is_refused_with_the_key(tmp_path):
    from submission.profiles import ProfileError

    path = tmp_path / "bad.toml"
    path.write_text('[prompt]\ngrid_format = "yaml"\n')
    with pytest.raises(ProfileError, match=f"{path}.*prompt.grid_format must be one of rows, json"):
        load_profile(path)


@pytest.mark.parametrize("profile", ("dense-27b-4xL4",) + MOE)
def test_the_program_cue_is_the_studys(profile):
    """The cue after the grid asks for "The transformation above, written as a self-contained Python function" and
    opens a code block with `def transform(grid):` (study ~2341-2343); the answer grammar forces it verbatim."""
    from submission.reasoning.reply_grammar import answer_grammar

    cue = load_profile(profile).engine.program_cue
    words = "The transformation above, written as a self-contained Python function"
    assert cue.strip().startswith(words) and cue.endswith("```python\ndef transform(grid):")
    assert words in answer_grammar(cue, 6000)
