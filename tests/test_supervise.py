"""Boot's supervisor (submission/kaggle/supervise.py) and the solver's heartbeat (submission/heartbeat.py).

The policy's table: a hang only while work is queued or running, progress resets its clock, the engine start is
bounded, relaunches are bounded and spaced, statuses 0, 143 (after boot's SIGTERM) and 2 are never relaunched, and
no relaunch comes when too little time is left. The shell, with a stand-in solver (a script written here that logs
attempts and writes heartbeats, and can be told to crash, hang with a child in its group and one in its own session,
or stall its engine start): each fault is relaunched with --resume, and repeated crashes end in a give-up with every
cause logged. Then the real solver (submission.main, the replay engine, real ARC tasks) SIGKILLed after its first
logged attempt: relaunched, and the log and answer file end with the attempts of both lives, none redone.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from submission import heartbeat as hb
from submission.kaggle.supervise import (Life, SuperviseConfig, decide, launched, no_relaunch, observe,
                                         relaunch_command, supervise)

REPO = Path(__file__).resolve().parents[1]
CONFIG = SuperviseConfig(hang_s=100.0, engine_start_s=500.0, max_restarts=3, restart_spacing_s=30.0,
                         min_solve_s=60.0)
LOTS = 40_000.0  # time left: plenty


def beat(phase="solving", attempts=0, queued=5, running=2, tokens=0, quiet_s=0.0) -> hb.Heartbeat:
    return hb.Heartbeat(phase, 1234, 0.0, 0.0, attempts, queued, running, tokens, quiet_s)


def solving(at: float = 0.0, progress_at: float = 10.0, **fields) -> Life:
    """A life launched at `at`, solving since 10 s, last progress at `progress_at`."""
    return replace(launched(at), starting_at=None, start_s=10.0, heartbeat=beat(**fields), progress_at=progress_at)


# --- the heartbeat -----------------------------------------------------------------------------------------------

def test_a_heartbeat_round_trips_and_a_broken_one_is_refused_with_its_reason(tmp_path):
    path = tmp_path / "attempts.heartbeat.json"
    assert hb.path_for_log(tmp_path / "attempts.jsonl") == path
    writer = hb.HeartbeatWriter(path)
    writer.beat("solving", attempts=3, queued=2, running=1, engine_tokens=99, quiet_s=5.0)
    got = hb.read(path)
    assert (got.phase, got.pid, got.attempts, got.queued, got.running, got.engine_tokens, got.quiet_s) == (
        "solving", os.getpid(), 3, 2, 1, 99, 5.0)
    assert hb.parse(hb.render(got)) == got
    for text, says in [("{", "not JSON"), ("[1]", "not a JSON object"), ('{"phase": "x"}', "lacks"),
                       ('{"phase": "nap", "pid": 1, "time": 0, "phase_s": 0}', "phase 'nap'"),
                       ('{"phase": "done", "pid": -1, "time": 0, "phase_s": 0}', "pid"),
                       ('{"phase": "done", "pid": 1, "time": 0, "phase_s": 0, "attempts": 1.5}', "attempts"),
                       ('{"phase": "done", "pid": 1, "time": 0, "phase_s": 0, "mood": 1}', "unknown")]:
        with pytest.raises(hb.HeartbeatError, match=says):
            hb.parse(text)
    with pytest.raises(ValueError):
        writer.beat("napping")
    hb.HeartbeatWriter(None).beat("done")  # no path: nothing written, nothing raised


def test_a_heartbeat_write_never_raises_and_falls_back_to_in_place_on_a_full_disk(tmp_path, monkeypatch):
    path = tmp_path / "hb.json"
    first = beat(attempts=1)
    assert hb.write(path, first)

    def full(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hb.os, "replace", full)  # the atomic path fails as on a full disk
    assert hb.write(path, beat(attempts=2))
    assert hb.read(path).attempts == 2 and not list(tmp_path.glob(".*tmp"))
    assert not hb.write(tmp_path / "missing-folder" / "hb.json", first)  # nothing works: False, no exception


def test_combined_heartbeats_take_the_most_advanced_phase_and_sum_the_counts():
    engine = replace(beat("solving", 3, 4, 2, 5), drafts=10, accepted_drafts=14, preemptions=1, decode_tok_s=9.5)
    phase, counts = hb.combine([beat("engine-start", 1, 2, 0, 10, 50.0), engine,
                                replace(beat(), decode_tok_s=12.0)])
    assert phase == "solving"
    assert counts == {"attempts": 4, "queued": 11, "running": 4, "engine_tokens": 15, "quiet_s": 50.0, "drafts": 10,
                      "accepted_drafts": 14, "preemptions": 1, "decode_tok_s": 9.5}  # the slower engine's rate
    assert hb.combine([]) == ("loading", {})


def test_a_combined_run_writes_a_heartbeat_its_supervisor_can_read(tmp_path):
    """submission.both wrote `beat(*combine(...))`: the counts dict went in as `attempts`, and every combined record
    was refused by `parse` (the supervisor skips it) until the lines ended."""
    writer = hb.HeartbeatWriter(tmp_path / "hb.json")
    writer.beat_combined([beat("engine-start", 1, 2, 0, 10), replace(beat("solving", 3, 4, 2, 5), preemptions=2)])
    read = hb.read(tmp_path / "hb.json")
    assert (read.phase, read.attempts, read.queued, read.engine_tokens, read.preemptions) == ("solving", 4, 6, 15, 2)


def test_the_engines_numbers_survive_the_heartbeat_file(tmp_path):
    writer = hb.HeartbeatWriter(tmp_path / "hb.json")
    writer.beat("solving", 2, 1, 3, 500, drafts=40, accepted_drafts=61, preemptions=2, decode_tok_s=8.25)
    read = hb.read(tmp_path / "hb.json")
    assert (read.drafts, read.accepted_drafts, read.preemptions, read.decode_tok_s) == (40, 61, 2, 8.25)
    with pytest.raises(hb.HeartbeatError, match="preemptions"):
        hb.parse(hb.render(read).replace('"preemptions":2', '"preemptions":-1'))


# --- the policy ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("life, now, expected", [
    # a hang is work queued or running, and no progress for hang_s
    (solving(progress_at=10.0), 105.0, "wait"),
    (solving(progress_at=10.0), 111.0, "restart"),
    (solving(progress_at=10.0, queued=0, running=0), 10_000.0, "wait"),  # nothing to do: not a hang
    (solving(progress_at=10.0, queued=0, running=1), 111.0, "restart"),  # running counts as work
    (solving(progress_at=10.0, queued=3, running=0), 111.0, "restart"),  # so does queued
    (solving(progress_at=10.0, quiet_s=300.0), 200.0, "wait"),  # the solver's own quiet_s, when longer
    (solving(progress_at=10.0, quiet_s=300.0), 311.0, "restart"),
    (replace(solving(progress_at=10.0), heartbeat=beat("done")), 10_000.0, "wait"),
    # the engine start is bounded from the launch, heartbeat or not
    (launched(0.0), 499.0, "wait"),
    (launched(0.0), 501.0, "restart"),
    (replace(launched(0.0), heartbeat=beat("loading")), 501.0, "restart"),
    (replace(solving(), starting_at=1000.0, heartbeat=beat("engine-start")), 1400.0, "wait"),  # a mid-run restart
    (replace(solving(), starting_at=1000.0, heartbeat=beat("engine-start")), 1501.0, "restart"),
    # a live solver already being ended is left to end
    (replace(solving(progress_at=10.0), killed_for="a hang"), 10_000.0, "wait"),
    (replace(solving(progress_at=10.0), asked_to_stop=True), 10_000.0, "wait"),
])
def test_a_live_solver_is_restarted_only_for_a_hang_or_an_endless_engine_start(life, now, expected):
    assert decide(CONFIG, now, life, restarts=0, time_left=LOTS).kind == expected


def test_progress_resets_the_hang_clock_and_only_attempts_tokens_or_phase_count():
    life = observe(solving(progress_at=0.0, attempts=1, tokens=10), 50.0, beat(attempts=1, tokens=10, queued=9))
    assert life.progress_at == 0.0  # queued changed, time changed: not progress
    for moved in (beat(attempts=2, tokens=10), beat(attempts=1, tokens=11)):
        assert observe(life, 90.0, moved).progress_at == 90.0
        assert decide(CONFIG, 150.0, observe(life, 90.0, moved), 0, LOTS).kind == "wait"
    assert decide(CONFIG, 150.0, life, 0, LOTS).kind == "restart"
    assert observe(life, 60.0, None) == life  # an unreadable heartbeat changes nothing


def test_the_engine_start_ends_at_solving_and_a_mid_run_engine_restart_starts_a_new_one():
    life = observe(launched(0.0), 5.0, beat("loading"))
    life = observe(life, 20.0, beat("engine-start"))
    assert life.starting_at == 0.0 and life.progress_at == 20.0
    life = observe(life, 300.0, beat("solving"))
    assert life.starting_at is None and life.start_s == 300.0
    life = observe(life, 900.0, beat("engine-start", attempts=5))
    assert life.starting_at == 900.0
    assert decide(CONFIG, 1401.0, life, 0, LOTS).reason.startswith("its engine start took over 500 s")


@pytest.mark.parametrize("code, asked, expected", [
    (0, False, "done"),
    (143, True, "done"), (-15, True, "done"),  # boot's own SIGTERM ended it
    (143, False, "restart"), (-15, False, "restart"),  # nobody here asked: abnormal
    (1, True, "give-up"),  # a failure after boot's SIGTERM is not relaunched, and not hidden
    (2, False, "give-up"),  # refused arguments would be refused again
    (1, False, "restart"), (-9, False, "restart"), (-11, False, "restart"), (137, False, "restart"),
])
def test_exit_statuses(code, asked, expected):
    life = replace(solving(), exit_code=code, ended_at=100.0, asked_to_stop=asked)
    assert decide(CONFIG, 131.0, life, 0, LOTS).kind == expected


def test_relaunches_are_spaced_bounded_and_name_their_cause():
    dead = replace(solving(), exit_code=-9, ended_at=100.0)
    assert decide(CONFIG, 110.0, dead, 0, LOTS).kind == "wait"  # 30 s after the death, not sooner
    action = decide(CONFIG, 130.0, dead, 0, LOTS)
    assert (action.kind, action.reason) == ("restart", "the solver killed by SIGKILL")
    assert decide(CONFIG, 130.0, dead, 2, LOTS).kind == "restart"
    gave_up = decide(CONFIG, 130.0, dead, 3, LOTS)
    assert gave_up.kind == "give-up" and "killed by SIGKILL" in gave_up.reason and "max_restarts" in gave_up.reason
    hung = replace(solving(progress_at=0.0), killed_for="a hang: no attempt finished", exit_code=-9, ended_at=200.0)
    assert decide(CONFIG, 230.0, hung, 0, LOTS).reason == "a hang: no attempt finished"  # the cause, not the kill
    live_hang = decide(CONFIG, 200.0, solving(progress_at=0.0), 3, LOTS)  # none left: it runs on, not killed
    assert live_hang.kind == "give-up" and "runs on to its own deadline" in live_hang.reason


def test_no_relaunch_when_too_little_time_is_left():
    dead = replace(solving(), exit_code=1, ended_at=100.0)
    # no engine start seen yet: engine_start_s (500) + min_solve_s (60), counted after the spacing
    assert decide(CONFIG, 130.0, dead, 0, time_left=561.0).kind == "restart"
    assert decide(CONFIG, 130.0, dead, 0, time_left=559.0).kind == "give-up"
    assert decide(CONFIG, 100.0, dead, 0, time_left=580.0).kind == "give-up"  # 30 s of spacing still to come
    # an engine start seen at 100 s: a relaunch is worth it with 161 s left
    assert decide(CONFIG, 130.0, dead, 0, time_left=161.0, start_seen_s=100.0).kind == "restart"
    assert "only 150 s left" in decide(CONFIG, 130.0, dead, 0, time_left=150.0, start_seen_s=100.0).reason
    assert decide(CONFIG, 200.0, solving(progress_at=0.0), 0, time_left=100.0, start_seen_s=100.0).kind == "give-up"
    assert no_relaunch(CONFIG, 0, LOTS, None) == ""


def test_a_relaunch_gets_resume_once_and_the_deadline_left():
    command = ["python", "-m", "submission.main", "--deadline", "1000", "--log", "x"]
    assert relaunch_command(command, "--resume", 250.0) == ["python", "-m", "submission.main", "--deadline",
                                                            "750.0", "--log", "x", "--resume"]
    assert relaunch_command(command + ["--resume"], "--resume", 0.0).count("--resume") == 1
    assert relaunch_command(["solver"], "--resume", 9.0) == ["solver", "--resume"]
    with pytest.raises(ValueError):
        SuperviseConfig(hang_s=-1)


# --- the shell, with a stand-in solver ------------------------------------------------------------------------------

STANDIN = r'''
import json, os, signal, subprocess, sys, time
from pathlib import Path
from submission.heartbeat import HeartbeatWriter

args = sys.argv[1:]
log, beat_path, lives = Path(args[args.index("--log") + 1]), args[args.index("--heartbeat") + 1], Path(os.environ["LIVES"])
with open(lives, "a") as f:
    f.write(json.dumps(args) + "\n")
life = len(lives.read_text().splitlines()) - 1
plan = os.environ["PLAN"].split(",")
mode = plan[min(life, len(plan) - 1)]
if log.exists() and log.stat().st_size and "--resume" not in args:
    sys.exit(2)
done = len(log.read_text().splitlines()) if log.exists() else 0
total = int(os.environ.get("ATTEMPTS", "6"))
heart = HeartbeatWriter(beat_path)
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
heart.beat("loading")
if mode == "refuse":
    sys.exit(2)
heart.beat("engine-start")
if mode == "slowstart":
    while True:
        time.sleep(0.1)
        heart.beat("engine-start")  # alive and writing, never ready
if mode == "waitterm":
    while True:
        heart.beat("solving", done, total - done, 1)
        time.sleep(0.1)
for i in range(done, total):
    heart.beat("solving", i, total - i, 1, 100 * i)
    if i - done == 2 and mode in ("crash", "hang", "kill"):
        if mode == "crash":
            os._exit(1)
        if mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)  # deaf to SIGTERM: only the group's SIGKILL ends it
        sleeper = [sys.executable, "-c", "import time; time.sleep(600)"]
        group = subprocess.Popen(sleeper)
        session = subprocess.Popen(sleeper, start_new_session=True)
        Path(os.environ["CHILDREN"]).write_text(f"{group.pid} {session.pid}")
        while True:  # stuck: the heartbeat stays fresh, but nothing moves
            heart.beat("solving", i, total - i, 1, 100 * i)
            time.sleep(0.1)
    time.sleep(0.05)
    with open(log, "a") as f:
        f.write(json.dumps({"attempt": i, "pid": os.getpid()}) + "\n")
heart.beat("done", total, 0, 0, 100 * total)
'''

FAST = SuperviseConfig(hang_s=1.5, engine_start_s=2.0, max_restarts=3, restart_spacing_s=0.2, min_solve_s=1.0,
                       kill_grace_s=1.0)


@pytest.fixture
def standin(tmp_path):
    script = tmp_path / "standin.py"
    script.write_text(STANDIN)
    log, lives, children = tmp_path / "attempts.jsonl", tmp_path / "lives.jsonl", tmp_path / "children"
    messages: list[str] = []

    def run(plan: str, config: SuperviseConfig = FAST, timeout: float = 60.0, until=None, attempts: int = 6) -> int:
        env = dict(os.environ, PYTHONPATH=str(REPO), PLAN=plan, LIVES=str(lives), CHILDREN=str(children),
                   ATTEMPTS=str(attempts))
        command = [sys.executable, str(script), "--log", str(log), "--heartbeat", str(tmp_path / "hb.json")]
        return supervise(command, "--resume", tmp_path, env, timeout, tmp_path / "hb.json", config, until=until,
                         log=messages.append)

    run.messages, run.log, run.children = messages, log, children
    run.lives = lambda: [json.loads(line) for line in lives.read_text().splitlines()]
    run.attempts = lambda: [json.loads(line)["attempt"] for line in log.read_text().splitlines()]
    return run


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] not in ("Z", "X")
    except OSError:
        return False


def test_a_crash_is_relaunched_once_with_resume_and_the_run_finishes(standin):
    assert standin("crash,ok") == 0
    first, second = standin.lives()
    assert "--resume" not in first and second.count("--resume") == 1 and second[:-1] == first
    assert standin.attempts() == list(range(6))  # both lives' attempts, none redone
    relaunches = [m for m in standin.messages if ": relaunch " in m]
    assert relaunches == ["supervise: the solver exited with status 1: relaunch 1 of at most 3, with --resume"]


def test_a_hang_is_killed_with_its_whole_process_group_and_relaunched(standin):
    assert standin("hang,ok") == 0
    group_child, session_child = map(int, standin.children.read_text().split())
    assert not alive(group_child) and not alive(session_child)  # its group, and what left the group, are gone
    assert len(standin.lives()) == 2 and standin.attempts() == list(range(6))
    text = "\n".join(standin.messages)
    assert "a hang: no attempt finished and no token generated for" in text and "(4 queued, 1 running)" in text
    assert "ending the solver (SIGTERM; SIGKILL to its process group after 1 s)" in text
    assert "processes the solver left (1 needed SIGKILL)" in text  # the one in its own session, deaf to SIGTERM


def test_an_engine_start_over_its_bound_is_relaunched(standin):
    assert standin("slowstart,ok") == 0
    assert len(standin.lives()) == 2 and standin.attempts() == list(range(6))
    assert any("its engine start took over 2 s (phase: engine-start)" in m for m in standin.messages)


def test_repeated_crashes_give_up_after_max_restarts_with_every_cause_logged(standin):
    assert standin("crash,kill", replace(FAST, max_restarts=2), attempts=20) == -signal.SIGKILL
    assert len(standin.lives()) == 3
    assert [m for m in standin.messages if ": relaunch " in m] == [
        "supervise: the solver exited with status 1: relaunch 1 of at most 2, with --resume",
        "supervise: the solver killed by SIGKILL: relaunch 2 of at most 2, with --resume"]
    assert standin.messages[-1] == ("supervise: the solver killed by SIGKILL; no relaunch: 2 relaunches already, "
                                    "the most allowed (max_restarts)")
    assert sorted(Counter(standin.attempts()).values()) == [1] * 6  # two per life, none redone


def test_refused_arguments_are_not_relaunched_and_until_ends_the_run_as_a_success(standin):
    assert standin("refuse") == 2 and len(standin.lives()) == 1
    assert standin.messages[-1].endswith("a relaunch would be refused too")
    standin.log.unlink(missing_ok=True)
    checked = []
    assert standin("waitterm", until=lambda: checked.append(1) or len(checked) > 3) == 0  # 143 after our SIGTERM


def test_no_relaunch_when_the_time_left_is_too_short_and_a_timeout_kills(standin):
    assert standin("crash,ok", replace(FAST, min_solve_s=1000.0)) == 1
    assert len(standin.lives()) == 1 and "no relaunch: only" in standin.messages[-1]
    standin.log.unlink()
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        standin("slowstart", replace(FAST, engine_start_s=100.0), timeout=2.0)
    assert time.monotonic() - started < 10


# --- the real solver -------------------------------------------------------------------------------------------------

def test_the_real_solver_killed_after_its_first_attempt_is_resumed_and_loses_nothing(arc_data, tmp_path,
                                                                                      replay_profile):
    """submission.main with the replay engine on real ARC tasks under supervise(): SIGKILLed once its first attempt
    is logged, relaunched with --resume; the log holds both lives' attempts, none redone, and the answer file is
    complete and exactly what the log gives."""
    from submission.answer_file import render_submission
    from submission.attempts import AttemptRecord, read_log
    from submission.schedule import Level
    from submission.selection import Candidates
    from submission.tasks import load_tasks

    tasks = load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks[:4]
    rng = random.Random(0)
    earlier = [AttemptRecord(t.id, i, a, Level(a - 1), 0, 4000, natural=True, thinking_tokens=rng.randint(100, 900),
                             answer_tokens=50, grid=label if rng.random() < 0.4 else ((rng.randrange(1, 10),),),
                             started_s=0.0, finished_s=rng.uniform(0.2, 0.6))
               for t in tasks for i, label in enumerate(t.test_outputs) for a in (1, 2, 3)]
    source = tmp_path / "earlier.jsonl"
    source.write_text("".join(json.dumps(r.to_json()) + "\n" for r in earlier))
    log, out, beat_path = tmp_path / "run.jsonl", tmp_path / "submission.json", tmp_path / "run.heartbeat.json"
    command = [sys.executable, "-m", "submission.main", "--tasks", str(arc_data / "arc-agi-2" / "evaluation"),
               "--max-tasks", "4", "--out", str(out), "--profile", str(replay_profile(tmp_path, source, 1.0)),
               "--log", str(log), "--deadline", "200"]
    killed: list[int] = []
    before: list = []

    def kill_after_the_first_attempt() -> None:
        end = time.monotonic() + 120
        while time.monotonic() < end:
            if log.exists() and log.read_text().count("\n") >= 1:
                pid = hb.read(beat_path).pid  # the default heartbeat, beside the log
                os.kill(pid, signal.SIGKILL)
                killed.append(pid)
                time.sleep(0.2)  # dead; its relaunch comes 0.5 s after supervise sees the death
                before.extend(read_log(log))
                return
            time.sleep(0.02)

    killer = threading.Thread(target=kill_after_the_first_attempt)
    killer.start()
    messages: list[str] = []
    status = supervise(command, "--resume", REPO, dict(os.environ), 280.0, beat_path,
                       SuperviseConfig(engine_start_s=120.0, restart_spacing_s=0.5, min_solve_s=10.0),
                       log=messages.append)
    killer.join()
    assert status == 0, messages
    assert killed and any("the solver killed by SIGKILL: relaunch 1 of at most 3, with --resume" in m
                          for m in messages)
    records = read_log(log)
    assert 1 <= len(before) < len(records) and records[:len(before)] == before  # both lives', nothing lost
    finished = Counter((r.task_id, r.test_index, r.attempt) for r in records if not r.aborted)
    assert max(finished.values()) == 1, finished  # none redone
    inputs = {(t.id, i) for t in tasks for i in range(len(t.test_inputs))}
    for level in (Level.FIRST, Level.SECOND):
        assert {(r.task_id, r.test_index) for r in records if r.level is level} == inputs
    candidates = Candidates()
    for record in records:
        candidates.add_record(record)
    expected = render_submission({t.id: len(t.test_inputs) for t in tasks},
                                 {key: candidates.answers(key) for key in candidates.by_input})
    assert json.loads(out.read_text()) == expected
    assert hb.read(beat_path).phase == "done" and hb.read(beat_path).pid != killed[0]
