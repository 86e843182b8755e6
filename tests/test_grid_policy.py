"""The grid line's pure policy: the shared queue (order, time limits, retries, failing workers), the views of
search and rescoring, and the choice of attempts by hits - NLL."""

from __future__ import annotations

import pytest

from submission.grid.queue import TaskQueue, task_cost, time_limit
from submission.grid.rescore import Candidate, choose, rescore, rescoring_views, search_views
from submission.grids import EMPTY_ANSWER
from submission.profiles import load_grid_profile
from submission.tasks import load_tasks


@pytest.fixture(scope="module")
def tasks(arc_data):
    return load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks[:12]


def test_queue_serves_cheapest_first_and_shares_the_time(tasks):
    costs = {t.id: task_cost(t) for t in tasks}
    queue = TaskQueue(costs, min_task_s=1200, max_task_s=3000)
    order = []
    while (nxt := queue.next(0, now=0, stop_new=1e9, hard_stop=1e9, live_workers=4)) is not None:
        order.append(nxt[0])
    assert [costs[t] for t in order] == sorted(costs.values()) and len(order) == len(tasks)
    assert time_limit(12 * 3600, queued=100, workers=4, lo=1200, hi=3000) == 12 * 3600 * 4 / 100
    assert time_limit(12 * 3600, queued=240, workers=4, lo=1200, hi=3000) == 1200  # 720 s share, clamped
    assert time_limit(12 * 3600, queued=10, workers=4, lo=1200, hi=3000) == 3000
    assert time_limit(12 * 3600, queued=1000, workers=4, lo=1200, hi=3000) == 1200
    assert time_limit(600, queued=1000, workers=4, lo=1200, hi=3000) == 600  # never past the end


def test_queue_stops_new_tasks_late(tasks):
    queue = TaskQueue({t.id: task_cost(t) for t in tasks}, 10, 20)
    assert queue.next(0, now=100, stop_new=100, hard_stop=200, live_workers=2) is None


def test_lost_and_failed_tasks_go_back_once_and_failing_workers_retire(tasks):
    queue = TaskQueue({t.id: task_cost(t) for t in tasks[:4]}, 10, 20, max_failures=3)
    first, _ = queue.next(0, 0, 1e9, 1e9, 2)
    queue.lost(0, first)  # its worker died: the task is the next one served, to another worker
    assert 0 in queue.retired and queue.next(0, 0, 1e9, 1e9, 1) is None
    again, _ = queue.next(1, 0, 1e9, 1e9, 1)
    assert again == first
    assert not queue.failed(1, again)  # failed on its second try: given up
    assert queue.given_up == [first] and first not in queue.pending
    for _ in range(2):
        task, _ = queue.next(1, 0, 1e9, 1e9, 1)
        retired = queue.failed(1, task)
    assert retired and 1 in queue.retired  # three failures in a row
    queue2 = TaskQueue({t.id: task_cost(t) for t in tasks[:4]}, 10, 20, max_failures=3)
    for _ in range(2):
        queue2.failed(0, queue2.next(0, 0, 1e9, 1e9, 1)[0])
    queue2.done(0, queue2.next(0, 0, 1e9, 1e9, 1)[0])  # a success resets the streak
    assert not queue2.failed(0, queue2.next(0, 0, 1e9, 1e9, 1)[0])


def test_views_are_deterministic_per_task_and_cover_the_group(tasks):
    task = tasks[0]
    views = search_views(task, 8, 2, seed=0)
    assert len(views) == 16 and views[0].is_identity
    assert sorted(v.dihedral for v in views) == sorted(list(range(8)) * 2)
    assert len({v.colours for v in views}) == 2
    assert views == search_views(task, 8, 2, seed=0) and views != search_views(task, 8, 2, seed=1)
    fresh = rescoring_views(task, 8, seed=0)
    assert sorted(v.dihedral for v in fresh) == list(range(8)) and len({v.colours for v in fresh}) == 8
    assert rescoring_views(tasks[1], 8, 0)[0].colours != fresh[0].colours or tasks[1].id == task.id


def test_score_is_hits_minus_nll_and_the_top_two_are_the_attempts():
    a, b, c = ((1,),), ((2,),), ((3, 3),)
    cands = [Candidate(a, hits=2, nll=0.5), Candidate(b, hits=5, nll=4.0), Candidate(c, hits=3, nll=0.1)]
    assert [x.score for x in cands] == [1.5, 1.0, pytest.approx(2.9)]
    assert choose(cands) == (c, a)
    assert choose(cands[:1]) == (a, a) and choose([]) == (EMPTY_ANSWER, EMPTY_ANSWER)
    assert Candidate.from_json(cands[2].to_json()) == cands[2]


def test_rescore_maps_each_candidate_into_every_view(tasks):
    """The likelihood function sees the candidate in each view's frame: a fake that rewards only the true output
    (as each view shows it) ranks the label first."""
    task = load_tasks_with_labels(tasks)
    label = task.test_outputs[0]
    wrong = tuple(tuple((c + 1) % 10 for c in row) for row in label)
    views = rescoring_views(task, 8, 0)
    expected = {tuple(v.apply_grid(label)) for v in views}
    from submission.grid.format import decode_grid

    def nll(ids, n):
        return 0.0 if decode_grid(list(ids[-n:])) in expected else 7.0

    ranked = rescore(task, 0, {wrong: 3, label: 1}, views, lambda items: [nll(*item) for item in items],
                     max_len=1 << 20).candidates
    assert [c.grid for c in ranked] == [label, wrong] and ranked[0].nll == 0.0 and ranked[1].nll == 7.0


def load_tasks_with_labels(tasks):
    return next(t for t in tasks if t.test_outputs is not None)


def test_shipped_grid_profiles_load():
    from submission.profiles import is_grid_profile

    assert is_grid_profile("grid-tiny") and not is_grid_profile("cpu-tiny")  # what submission.main dispatches on
    profile = load_grid_profile("grid-tiny")
    assert profile.run.devices == ("cpu", "cpu") and profile.run.context(5) == profile.run.max_len[-1]
    study = load_grid_profile("grid-4b-4xL4")  # SPEC section 10's numbers
    assert (study.ttt.rank, study.ttt.alpha, study.ttt.sequences, study.ttt.lr) == (256, 32, 128, 5e-5)
    search = study.search
    assert (search.cutoff, search.dihedrals * search.colour_perms, study.rescore.views) == (0.2, 16, 8)
    assert study.run.max_len == (13312, 12288, 10240, 8192) and len(study.run.devices) == 4
    with pytest.raises(ValueError, match="unknown key"):
        from submission.grid.profile import GridProfile
        from submission.profiles import from_table

        from_table(GridProfile, {"search": {"cut_off": 0.2}}, "x.toml")


def test_dfs_batch_is_checked_against_the_batch_it_splits(tmp_path):
    """search.dfs_batch: views searched in lockstep, so at least 1 and at most the views of a batch; a bad value
    names the file and the field."""
    from submission.profiles import ProfileError

    assert load_grid_profile("grid-tiny").search.dfs_batch >= 1
    for value in (0, 5):
        path = tmp_path / "bad.toml"
        path.write_text(f'line = "grid"\n[search]\nviews_per_batch = 4\ndfs_batch = {value}\n')
        with pytest.raises(ProfileError, match=rf"bad.toml.search: search.dfs_batch must be between 1 and "
                                               rf"search.views_per_batch \(4\), got {value}"):
            load_grid_profile(path)


def test_a_scaled_run_fits_a_rehearsal_as_the_full_run_fits_twelve_hours():
    """The commit run's rehearsal (submission.main --scale-schedule): grid-4b-4xL4 unscaled in 1,800 s would stop
    new tasks after 900 s with a 517-s minimum per task; scaled, every margin and bound shrinks by 1800 / 43200."""
    run = load_grid_profile("grid-4b-4xL4").run
    small = run.scaled(1800.0)
    f = 1800.0 / 43200.0
    assert small.time_limit_s == 1800.0 and small.devices == run.devices and small.max_len == run.max_len
    assert (small.hard_stop_margin_s, small.stop_new_margin_s) == (420.0 * f, 900.0 * f)
    assert (small.min_task_s, small.max_task_s) == (517.0 * f, 3000.0 * f)
    assert (small.size_tokens, small.task_s, small.ttt_s) == (run.size_tokens, run.task_s, run.ttt_s)  # ratios


def test_a_task_budget_by_size_shares_the_time_in_proportion_to_need():
    from submission.grid.profile import RunConfig

    run = RunConfig(size_tokens=(1000, 11000), task_s=(500.0, 1500.0), ttt_s=(200.0, 900.0))
    assert [run.task_need(c) for c in (10, 1000, 6000, 11000, 50000)] == [500.0, 500.0, 1000.0, 1500.0, 1500.0]
    assert run.ttt_share(1000, 0.4) == pytest.approx(0.4) and run.ttt_share(11000, 0.4) == pytest.approx(0.6)
    assert RunConfig().task_need(5000) == 1.0 and RunConfig().ttt_share(5000, 0.4) == 0.4  # no table: all alike
    costs = {"small": 1000, "big": 11000}
    queue = TaskQueue(costs, 0.0, 1e9, needs={t: run.task_need(c) for t, c in costs.items()})
    small, big = queue.next(0, 0, 1e9, 2000.0, 1), queue.next(1, 0, 1e9, 2000.0, 1)
    # one worker, 2,000 s for 2,000 s of need: each its own need; the running small task counts for the big one
    assert small == ("small", pytest.approx(500.0)) and big == ("big", pytest.approx(1500.0))
    queue.done(0, "small")
    assert queue.running == {1: "big"}


@pytest.mark.parametrize("bad, message", [
    ({"size_tokens": (1000, 2000), "task_s": (500.0,)}, "one value per run.size_tokens"),
    ({"size_tokens": (2000, 1000), "task_s": (500.0, 900.0)}, "run.size_tokens must increase"),
    ({"size_tokens": (1000,), "task_s": (500.0,), "ttt_s": (600.0,)}, "each run.ttt_s within it"),
])
def test_a_budget_table_that_does_not_line_up_is_refused_by_name(bad, message, tmp_path):
    from submission.profiles import ProfileError

    lines = "\n".join(f"{k} = {list(v)}" for k, v in bad.items())
    (tmp_path / "bad.toml").write_text(f'line = "grid"\n[run]\n{lines}\n')
    with pytest.raises(ProfileError, match=rf"bad.toml.*{message}"):
        load_grid_profile(tmp_path / "bad.toml")


def test_the_grid_detail_of_a_record_reads_and_writes_the_logs_keys_and_refuses_unknown_ones():
    """The grid line's part of an attempt record is typed (submission.attempts.GridDetail, issue 30) but its JSON is
    the log's as before: attempt 1 with every key in the order the workers wrote them, attempt 2 with `worker`
    alone; a log from before the training's report (no ttt_checkpointing, ttt_oom_retries, ttt_skipped) still
    reads; a misspelt key is refused by name."""
    import json

    from submission.attempts import AttemptRecord, GridDetail

    first = {"worker": 1, "time_limit_s": 1200.0, "stage_s": {"ttt": 400.0, "search": 500.0, "rescore": 100.0},
             "ttt_steps": 30, "ttt_planned": 32, "ttt_checkpointing": True, "ttt_oom_retries": 1, "ttt_skipped": 0,
             "ttt_loss": [2.5, 0.75], "search_steps": 812, "complete": True,
             "candidates": [{"grid": [[1, 2]], "hits": 3, "nll": 0.25}]}
    base = {"task_id": "t", "test_index": 0, "level": 0, "seed": 0, "cap": 0}
    for detail in (first, {"worker": 1}):
        line = json.dumps({**base, "attempt": 1, "grid_line": detail})
        record = AttemptRecord.from_json(json.loads(line))
        assert isinstance(record.grid_line, GridDetail)
        assert json.dumps(record.to_json()["grid_line"]) == json.dumps(detail)  # same keys, same order
    older = {k: v for k, v in first.items() if k not in ("ttt_checkpointing", "ttt_oom_retries", "ttt_skipped")}
    record = AttemptRecord.from_json({**base, "attempt": 1, "grid_line": older})
    assert record.grid_line.ttt_loss == (2.5, 0.75) and record.grid_line.ttt_checkpointing is None
    with pytest.raises(ValueError, match=r"grid_line: unknown fields \['ttt_skiped'\]"):
        AttemptRecord.from_json({**base, "attempt": 1, "grid_line": {"worker": 0, "ttt_skiped": 1}})


def test_every_task_trains_in_full_unless_the_forecast_says_the_run_cannot_afford_it():
    """Issue 45: the training budget comes from the whole run, not from a task's limit alone. Two workers, 3,000 s
    each before the hard stop: three tasks needing 1,000 s each fit (each trains every step); a fourth and fifth
    needing 2,000 s more would not, so a task started then gets its training share."""
    from submission.grid.queue import training_plan

    assert training_plan(3000.0, 6000.0, 2).full and not training_plan(3000.0, 6001.0, 2).full
    assert "6001 s of tasks queued and running, 2 workers x 3000 s left" in training_plan(3000.0, 6001.0, 2).why
    queue = TaskQueue({"a": 1, "b": 2, "c": 3, "d": 4}, 100.0, 5000.0, needs=dict.fromkeys("abcd", 1000.0))
    assert queue.next(0, 0.0, 1e9, 1900.0, 2)[0] == "a" and not queue.plans["a"].full  # 4,000 s for 2 x 1,900
    assert queue.next(1, 0.0, 1e9, 1900.0, 2)[0] == "b" and not queue.plans["b"].full
    queue.done(0, "a")  # early, at 400 s: the running "b" counts only the 600 s left of its need
    assert queue.next(0, 400.0, 1e9, 1900.0, 2)[0] == "c" and queue.plans["c"].full  # 2,600 s for 2 x 1,500
    alike = {"a": 1, "b": 2, "c": 3, "d": 4}  # no table of needs: each task counts the least it is given
    assert not TaskQueue(alike, 1000.0, 3000.0).next(0, 0.0, 1e9, 1900.0, 2) is None
    tight, roomy = TaskQueue(alike, 1000.0, 3000.0), TaskQueue(alike, 1000.0, 3000.0)
    tight.next(0, 0.0, 1e9, 1900.0, 2)
    roomy.next(0, 0.0, 1e9, 2000.0, 2)
    assert not tight.plans["a"].full and roomy.plans["a"].full


def test_the_checkpointing_decision_counts_the_training_state_before_it_exists():
    """Issue 45: free memory is read after the allocator's cache is emptied, and the gradients and AdamW moments
    training is about to allocate (three copies of the trainable parameters) are taken from it."""
    import math

    from submission.grid.ttt import activation_bytes_per_token, free_memory, training_state_bytes, use_checkpointing

    per_token = activation_bytes_per_token(36, 2560, 9728, 256, 16, 2)  # Qwen3 4B, rank 256, bf16
    state = training_state_bytes(200_000_000, 2)  # ~0.2 B trainable parameters in bf16
    assert state == 1_200_000_000
    free = 1500 * per_token / 0.8 + state / 2  # room for 1,500 tokens' activations if the state were not counted
    assert use_checkpointing("auto", 1450, per_token, free, 0.8)[0] is False  # the state left out: fits
    on, why = use_checkpointing("auto", 1450, per_token, free, 0.8, state)
    assert on and "1.12 GiB of gradients and optimiser state" in why

    class Cuda:
        def __init__(self):
            self.calls = []

        def empty_cache(self):
            self.calls.append("empty_cache")

        def mem_get_info(self, device):
            self.calls.append("mem_get_info")
            return (7.0, 24.0)

    class Torch:
        cuda = Cuda()

    class Device:
        def __init__(self, kind):
            self.type = kind

    assert free_memory(Torch, Device("cuda")) == 7.0 and Torch.cuda.calls == ["empty_cache", "mem_get_info"]
    assert free_memory(Torch, Device("cpu")) == math.inf
