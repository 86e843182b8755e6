"""The solver: one request per attempt on a deadline-aware schedule, answers rewritten after every attempt.

    python -m submission.main --tasks PATH --out submission.json --profile NAME [--model DIR]
                              [--deadline SECONDS] [--log attempts.jsonl] [--resume] [--solutions PATH]

`--deadline` is the time limit L in seconds from now (default: the profile's schedule.time_limit_s); the schedule's
margins count back from it. The answer file exists, complete, before the first request and is rewritten atomically
after every attempt; every finished attempt is appended to the log (flushed and fsynced). `--resume` continues from
the log: finished attempts are restored, never redone. A watchdog ends the process before the deadline whatever the
engine does. An attempt the engine fails is retried once; if the engine dies it is restarted once and its running
attempts go back to the queue; the answers so far are always kept.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import threading
import time
from collections import Counter
from dataclasses import asdict, replace
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from submission.answers import AnswerFile, render_submission
from submission.attempts import AttemptLog, AttemptRecord, read_log
from submission.config import Profile, ProfileError, load_profile, profile_to_toml
from submission.engines.base import EngineDead
from submission.grid import is_grid_profile
from submission.prompt import render, task_text, tool_turn
from submission.sandbox import Sandbox
from submission.schedule import InputInfo, Level, Scheduler
from submission.score import score
from submission.solve import Attempts, Candidates, Renderer, ToolTurn, estimated_ids, request_id
from submission.tasks import LoadError, TaskSet, load_tasks
from submission.views import View



def make_engine(profile: Profile):
    kind, model = profile.engine.kind, profile.engine.model
    if kind == "hf":
        from submission.engines.hf import HFEngine

        return HFEngine(model, profile.engine)
    if kind == "replay":
        from submission.engines.replay import ReplayEngine

        return ReplayEngine(read_log(model), profile.engine, profile.engine.replay_time_scale)
    from submission.engines.vllm import VLLMEngine

    return VLLMEngine(model, profile.engine)


def make_renderer(profile: Profile) -> tuple[Renderer, ToolTurn]:
    """Prompt token ids and tool-turn ids through the model's own tokenizer; the replay engine has none and gets
    length estimates."""
    if profile.engine.kind == "replay":
        return (lambda task, index, view, extra: estimated_ids(task_text(task, index, profile.prompt, view) + extra),
                estimated_ids)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(profile.engine.model)
    return (lambda task, index, view, extra: render(tokenizer, task, index, profile.prompt, view, extra)[1],
            lambda text: tool_turn(tokenizer, text, profile.prompt)[1])


def start_watchdog(time_limit_s: float, hard_stop_s: float) -> None:
    """Exit between the hard stop and the limit even if the event loop is stuck (the answer file is always
    current); SIGALRM's default action kills the process one second before the limit if even that fails."""
    exit_at = hard_stop_s + (time_limit_s - hard_stop_s) / 2
    timer = threading.Timer(exit_at, lambda: (print("watchdog: deadline reached, exiting", file=sys.stderr),
                                              os._exit(0)))
    timer.daemon = True
    timer.start()
    signal.signal(signal.SIGALRM, signal.SIG_DFL)
    signal.alarm(max(int(time_limit_s - 1), 1))


class Run:
    def __init__(self, args: argparse.Namespace, profile: Profile, tasks: TaskSet):
        self.args, self.profile, self.tasks = args, profile, tasks
        self.by_id = {t.id: t for t in tasks.tasks}
        self.answers = AnswerFile(args.out, tasks.test_counts())
        self.candidates = Candidates()
        self.start = time.monotonic()
        self.stats: Counter = Counter()
        self.finished: list[AttemptRecord] = []
        # the engine's per-window throughput (tokens, running requests), for `sim calibrate`
        self.stats_path = Path(args.log).with_suffix(".stats.jsonl") if args.log else None
        self._windows_written = 0

    def flush_stats(self, engine) -> None:
        if self.stats_path is None:
            return
        new = engine.meter.windows[self._windows_written:]
        if new:
            with open(self.stats_path, "a", encoding="utf-8") as f:
                f.writelines(json.dumps({**asdict(w), "start": w.start - self.start}) + "\n" for w in new)
            self._windows_written += len(new)

    def clock(self) -> float:
        return time.monotonic() - self.start

    def record(self, scheduler: Scheduler, record: AttemptRecord, log: AttemptLog | None,
               scheduled: bool = False) -> None:
        """A finished attempt: logged, handed to the scheduler (unless it already knows), answers updated."""
        if log is not None:
            log.append(record)
        if not scheduled:
            scheduler.on_finished(self.clock(), record.outcome())
        self.finished.append(record)
        for key in self.candidates.add_record(record):
            self.answers.update(key[0], key[1], self.candidates.answers(key))

    def restore(self, scheduler: Scheduler, attempts: Attempts) -> None:
        for record in read_log(self.args.log):
            if record.task_id not in self.by_id:
                continue
            scheduler.restore(record.outcome())
            attempts.note_program(record)
            self.finished.append(record)
            for key in self.candidates.add_record(record):
                self.answers.update(key[0], key[1], self.candidates.answers(key))
        self.stats["restored"] = len(self.finished)

    async def go(self) -> None:
        profile = self.profile
        infos = []
        render_ids, tool_turn_ids = make_renderer(profile)
        for task in self.tasks.tasks:
            for index in range(len(task.test_inputs)):
                infos.append(InputInfo(task.id, index, len(render_ids(task, index, View(), "")), len(task.test_inputs)))
        scheduler = Scheduler(profile.schedule, infos)
        engine = make_engine(profile)
        await engine.start()
        with Sandbox(profile.sandbox) as sandbox:
            attempts = Attempts(profile, self.by_id, engine, sandbox, render_ids, self.clock, tool_turn_ids)
            if self.args.resume and self.args.log and Path(self.args.log).exists():
                self.restore(scheduler, attempts)
            log = AttemptLog(self.args.log) if self.args.log else None
            try:
                await self.loop(scheduler, attempts, log, len(infos))
            finally:
                if log is not None:
                    log.close()
                await attempts.engine.close()

    async def loop(self, scheduler: Scheduler, attempts: Attempts, log: AttemptLog | None, n_inputs: int) -> None:
        hard_stop = scheduler.config.hard_stop
        running: dict[asyncio.Task, object] = {}
        restarted = False
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, transient=False) as progress:
            bar = progress.add_task("inputs answered", total=n_inputs)
            while self.clock() < hard_stop:
                while (request := scheduler.next(self.clock())) is not None:
                    running[asyncio.create_task(attempts.run(request))] = request
                if not running:
                    break
                done, _ = await asyncio.wait(running, timeout=max(hard_stop - self.clock(), 0),
                                             return_when=asyncio.FIRST_COMPLETED)
                dead = False
                for task in done:
                    request = running.pop(task)
                    try:
                        record = task.result()
                    except EngineDead:
                        dead = True
                        scheduler.on_failed(self.clock(), request)
                        continue
                    except Exception as err:  # noqa: BLE001 - one attempt's failure never ends the run
                        record = AttemptRecord(request.task_id, request.test_index, request.attempt, request.level,
                                               request.seed, request.cap, aborted=True,
                                               finish=f"error: {type(err).__name__}: {err}",
                                               started_s=self.clock(), finished_s=self.clock())
                    if not record.finish.startswith("error"):
                        self.record(scheduler, record, log)
                        continue
                    self.stats["failed attempts"] += 1
                    if not scheduler.on_failed(self.clock(), request):  # failed twice: finished without answer
                        self.record(scheduler, record, log, scheduled=True)
                if dead:
                    if restarted:
                        print("the engine died again after its restart: stopping with the answers so far",
                              file=sys.stderr)
                        break
                    print("the engine died: restarting it once; its running attempts go back to the queue",
                          file=sys.stderr)
                    restarted = True
                    self.stats["engine restarts"] += 1
                    for task, request in running.items():
                        task.cancel()
                        scheduler.on_failed(self.clock(), request)
                    running.clear()
                    self.flush_stats(attempts.engine)
                    try:
                        await attempts.engine.close()
                    except Exception as err:  # noqa: BLE001 - a dead engine may fail to close
                        print(f"closing the dead engine: {type(err).__name__}: {err}", file=sys.stderr)
                    attempts.engine = make_engine(self.profile)
                    self._windows_written = 0
                    await attempts.engine.start()
                self.flush_stats(attempts.engine)
                answered = sum(1 for key in self.candidates.by_input if self.candidates.by_input[key])
                progress.update(bar, completed=answered, description=(
                    f"inputs answered | attempts {len(self.finished)} | in flight {len(running)}"))
            for task, request in running.items():  # the hard stop: abort what still runs
                await attempts.engine.abort(request_id(request))
                task.cancel()
            self.stats["aborted at the hard stop"] = len(running)
            scheduler.abort_all()
        self.stats["skipped (cap too small)"] = len(scheduler.skipped)

    def _agent_records(self) -> list[AttemptRecord]:
        return [r for r in self.finished if r.level is Level.FIRST] if self.profile.tool_agent.enabled else []

    def summary(self) -> str:
        by_level = Counter(r.level.name for r in self.finished)
        outcome = Counter("aborted" if r.aborted else "natural" if r.natural else "forced" for r in self.finished)
        answered = sum(1 for key, c in self.candidates.by_input.items() if c)
        lines = [
            f"answered test inputs: {answered} of {sum(self.tasks.test_counts().values())} "
            f"({len(self.tasks.errors)} unreadable tasks answered [[0]])",
            f"attempts: {len(self.finished)} by level {dict(by_level)}, by outcome {dict(outcome)}",
            f"tokens: thinking {sum(r.thinking_tokens for r in self.finished):,}, "
            f"answer {sum(r.answer_tokens for r in self.finished):,}",
            f"programs train-perfect: {sum(r.train_perfect for r in self.finished)}",
            *([f"tool agent: {sum(r.turns for r in agent)} turns in {len(agent)} first attempts, "
               f"{sum(r.turns > 1 for r in agent)} shown their checks"] if (agent := self._agent_records()) else []),
            f"time used: {self.clock():.0f} s; " + ", ".join(f"{k}: {v}" for k, v in self.stats.items()),
        ]
        labels = {t.id: t.test_outputs for t in self.tasks.tasks if t.test_outputs is not None}
        if labels:
            report = score(render_submission(self.answers.test_counts, self.answers.answers), labels)
            lines.append(f"score: task-weighted {report.task_weighted:.2f}, input-weighted {report.input_weighted:.2f}")
        return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m submission.main", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", required=True, type=Path, help="task directory, task file or Kaggle challenges")
    parser.add_argument("--out", required=True, type=Path, help="the answer file (submission.json)")
    parser.add_argument("--profile", default="cpu-tiny", help="profile name (profiles/NAME.toml) or TOML path")
    parser.add_argument("--model", help="checkpoint folder (or attempt log for the replay engine)")
    parser.add_argument("--deadline", type=float, help="time limit in seconds from now")
    parser.add_argument("--log", type=Path, help="attempt log (JSONL) to append to")
    parser.add_argument("--resume", action="store_true", help="continue from --log without redoing attempts")
    parser.add_argument("--solutions", type=Path, help="labels, to print the score at the end")
    parser.add_argument("--max-tasks", type=int, help="only the first N tasks by id (demos)")
    args = parser.parse_args(argv)
    if is_grid_profile(args.profile):  # the grid line (SPEC section 10): its own workers, same answer file and log
        from submission.grid.main import run as run_grid_line

        return run_grid_line(args)
    try:
        profile = load_profile(args.profile)
        if args.model:
            profile = replace(profile, engine=replace(profile.engine, model=args.model))
        if args.deadline:
            profile = replace(profile, schedule=replace(profile.schedule, time_limit_s=args.deadline))
        tasks = load_tasks(args.tasks, args.solutions)
        if args.max_tasks:
            kept = tasks.tasks[:args.max_tasks]
            tasks = TaskSet(kept, tuple(e for e in tasks.errors if e.task_id < (kept[-1].id if kept else "")))
    except (ProfileError, LoadError, ValueError) as err:
        print(f"error: {err}", file=sys.stderr)
        return 2
    if not profile.engine.model:
        print(f"error: profile {profile.name}: engine.model is empty; pass --model DIR", file=sys.stderr)
        return 2
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"):
        os.environ.setdefault(name, "1")  # the competition box has no network: never wait on a hub
    start_watchdog(profile.schedule.time_limit_s, profile.schedule.hard_stop)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    (args.out.parent / "profile.toml").write_text(profile_to_toml(profile))
    for error in tasks.errors:
        print(f"skipped (answered [[0]]): {error}", file=sys.stderr)
    run = Run(args, profile, tasks)
    try:
        asyncio.run(run.go())
    finally:
        print(run.summary())
    return 0


if __name__ == "__main__":
    sys.exit(main())
