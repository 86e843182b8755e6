"""The reasoning line's run (submission.main with a profile that has no `line`): one request per attempt on a
deadline-aware schedule, answers rewritten after every attempt.

`--deadline` is the time limit L in seconds from now (default: the profile's schedule.time_limit_s); the schedule's
margins count back from it, and a limit inside them is refused with the numbers. `--scale-schedule` shrinks every
margin and cap in proportion instead (`ScheduleConfig.scaled`: the notebook's commit-run rehearsal). The answer
file exists, complete, before the first request and is rewritten atomically after every attempt (a failed write,
e.g. a full disk, leaves the previous file and is retried); every finished attempt is appended to the log (flushed
and fsynced). An existing log is refused unless `--resume`, which continues from it: a torn last line is cut,
finished attempts are restored (into the answer file at once, before the engine starts), never redone. A watchdog
ends the process before the deadline whatever the engine does (submission.cli.watchdog: disarmed when the run
returns, never armed for in-process callers that pass `watchdog=False`). SIGTERM stops new work, aborts what runs
and ends with the answers so far. An attempt the engine fails is retried once; if the engine dies, its leftover
processes are ended (GPU memory freed), a new engine starts in fresh processes and the running attempts go back to
the queue; a second death, or a restart that fails, ends the run with every answer kept and exit status 1 (boot's
supervisor then relaunches it with `--resume`, in new processes). The heartbeat file (`--heartbeat`, default: beside
the log, attempts.heartbeat.json; submission/heartbeat.py) says at every loop iteration and phase change what the run
is doing, for that supervisor to tell a hang or an endless engine start from a slow run.
At the hard stop (or on SIGTERM) every running attempt is aborted and logged as aborted (`finish = "aborted"`);
`--resume` does not restore those, so a later run redoes them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, replace
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from submission import engine_numbers
from submission.answer_file import AnswerFile, render_submission
from submission.attempts import AttemptLog, AttemptRecord, read_log, repair_log
from submission.cli import (
    go_offline,
    heartbeat_path,
    refuse,
    refuse_old_log,
    run_tasks,
    score_line,
    watchdog,
    with_deadline,
)
from submission.reasoning.profile import Profile
from submission.reasoning.engines.base import Engine, EngineDead
from submission.heartbeat import HeartbeatWriter
from submission.processes import become_subreaper, descendants, end_processes, leftovers
from submission.profiles import to_toml
from submission.reasoning.prompt import render, task_text, tool_turn
from submission.sandbox.client import Sandbox
from submission.schedule import InputInfo, Level, Scheduler
from submission.selection import Candidates
from submission.reasoning.solve import Attempts, Renderer, ToolTurn, estimated_ids, request_id
from submission.tasks import LoadError, TaskSet
from submission.views import View

ABORT_GRACE_S = 5.0  # at most this long (and a quarter of the last margin) for aborted attempts to return their own
NewEngine = Callable[[Profile], Engine]  # a profile's engine, not started


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


class Run:
    """One reasoning-line run: `new_engine` makes its engine (again after a death: a restart needs fresh processes;
    submission.reasoning.engines.make_engine, or a test's fake)."""

    def __init__(self, args: argparse.Namespace, profile: Profile, tasks: TaskSet, new_engine: NewEngine):
        self.args, self.profile, self.tasks = args, profile, tasks
        self.make_engine = new_engine
        self.by_id = {t.id: t for t in tasks.tasks}
        self.answers = AnswerFile(args.out, tasks.test_counts())
        self.candidates = Candidates(transfer=profile.selection.transfer)
        self.start = time.monotonic()
        self.stats: Counter = Counter()
        self.finished: list[AttemptRecord] = []
        # the engine's per-window throughput (tokens, running requests), for `sim calibrate`
        self.stats_path = Path(args.log).with_suffix(".stats.jsonl") if args.log else None
        self._windows_written = 0
        self.stopping = ""  # why the run stops early ("SIGTERM"), checked by the loop
        self.unwritten = ""  # why the last answer-file write failed (a full disk); retried at every update
        self.failed = ""  # why the run ended early with an error (an engine that could not be restarted)
        self.sandbox: Sandbox | None = None
        self.not_engine: set[int] = set()  # processes that were there before the engine
        self.heartbeat = HeartbeatWriter(heartbeat_path(args))
        self.engines: list = []  # every engine this run started (a restart adds one): the heartbeat counts their tokens

    def new_engine(self):
        engine = self.make_engine(self.profile)
        self.engines.append(engine)
        return engine

    def measured(self) -> engine_numbers.EngineNumbers:
        """What the engines measured of themselves so far (every restart's)."""
        return engine_numbers.from_meters(engine.meter for engine in self.engines)

    def beat(self, phase: str, scheduler: Scheduler | None = None, running: int = 0) -> None:
        """The heartbeat: the phase, attempts finished, work queued and running, tokens generated so far, and the
        engines' own numbers (drafts verified and accepted, preemptions, the decode rate of a running request)."""
        n = self.measured()
        self.heartbeat.beat(phase, len(self.finished), scheduler.pending() if scheduler else 0, running, n.tokens,
                            drafts=n.drafts, accepted_drafts=n.accepted_drafts, preemptions=n.preemptions,
                            decode_tok_s=n.decode_tok_s or 0.0)

    def flush_stats(self, engine, final: bool = False) -> None:
        """Append the engine's finished windows to the stats file; `final` ends the one in progress too."""
        if self.stats_path is None:
            return
        if final:
            engine.meter.close()
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
            try:
                log.append(record)
            except OSError as err:  # a full disk: the attempt still counts for this run's answers
                if not self.stats["log writes failed"]:
                    print(f"attempt log {log.path} not written ({err}): the run goes on, but a --resume would redo "
                          "the attempts missing from it", file=sys.stderr)
                self.stats["log writes failed"] += 1
        if not scheduled:
            scheduler.on_finished(self.clock(), record.outcome())
        self.finished.append(record)
        self.update_answers(self.candidates.add_record(record))

    def update_answers(self, keys) -> None:
        """Answers of the changed inputs into the answer file. A failed write (a full disk) leaves the previous file,
        which is valid, and is retried at the next update and at the end; the run goes on."""
        changed = [self.answers.set(key[0], key[1], self.candidates.answers(key)) for key in keys]
        if not any(changed) and not self.unwritten:
            return
        try:
            self.answers.write()
        except OSError as err:
            if not self.unwritten:
                print(f"answer file {self.answers.path} not written ({err}): the previous version stands; "
                      "retrying at every update", file=sys.stderr)
            self.unwritten = str(err)
            self.stats["answer-file writes failed"] += 1
            return
        if self.unwritten:
            print(f"answer file {self.answers.path} written again (after: {self.unwritten})", file=sys.stderr)
            self.unwritten = ""

    def restore(self, scheduler: Scheduler) -> list[AttemptRecord]:
        """`--resume`: the log's finished attempts into the scheduler and the answer file, before the engine starts:
        the answer file was just written with [[0]] everywhere, and must not stay so for the minutes an engine takes
        to start (a run killed then, or ended by its deadline, would leave it so while the log holds the answers)."""
        repaired = repair_log(self.args.log)  # before appending: a torn line would swallow the next record
        if repaired:
            print(f"attempt log: {repaired}", file=sys.stderr)
        restored, changed = [], set()
        for record in read_log(self.args.log):
            if record.task_id not in self.by_id or record.finish == "aborted":  # cut by a hard stop: not finished
                continue
            scheduler.restore(record.outcome())
            self.finished.append(record)
            restored.append(record)
            changed.update(self.candidates.add_record(record))
        self.update_answers(sorted(changed))  # one write for the whole log
        self.stats["restored"] = len(restored)
        return restored

    def on_sigterm(self) -> None:
        print("SIGTERM: no new attempts; aborting the running ones and ending with the answers so far",
              file=sys.stderr, flush=True)
        self.stopping = "SIGTERM"

    async def go(self) -> None:
        profile = self.profile
        self.beat("loading")
        infos = []
        render_ids, tool_turn_ids = make_renderer(profile)
        for task in self.tasks.tasks:
            for index in range(len(task.test_inputs)):
                infos.append(InputInfo(task.id, index, len(render_ids(task, index, View(), "")), len(task.test_inputs)))
        scheduler = Scheduler(profile.schedule, infos)
        try:
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, self.on_sigterm)
        except (ValueError, RuntimeError):  # not the main thread (an in-process caller): SIGTERM keeps its default
            pass
        restored = []
        if self.args.resume and self.args.log and Path(self.args.log).exists():
            restored = self.restore(scheduler)
        self.not_engine = descendants(os.getpid())  # an in-process caller's own children are never swept
        self.beat("engine-start", scheduler)
        engine = self.new_engine()
        await engine.start()
        with Sandbox(profile.sandbox) as sandbox:
            self.sandbox = sandbox
            attempts = Attempts(profile, self.by_id, engine, sandbox, render_ids, self.clock, tool_turn_ids)
            for record in restored:
                attempts.note_program(record)
            log = AttemptLog(self.args.log) if self.args.log else None
            try:
                await self.loop(scheduler, attempts, log, len(infos))
            finally:
                self.beat("done", scheduler)
                if log is not None:
                    log.close()
                self.flush_stats(attempts.engine, final=True)
                await self.close_engine(attempts.engine)
                if self.unwritten:
                    self.update_answers(())  # one more try at the end

    async def close_engine(self, engine) -> None:
        try:
            await engine.close()
        except Exception as err:  # noqa: BLE001 - a dead engine may fail to close
            print(f"closing the engine: {type(err).__name__}: {err}", file=sys.stderr)

    async def restart_engine(self, attempts: Attempts, scheduler: Scheduler) -> bool:
        """Close the dead engine, end every process it left (its GPU memory is free once they have exited), start a
        new one. False, with the reason printed, when the new one does not start."""
        self.flush_stats(attempts.engine, final=True)
        self.beat("engine-start", scheduler)
        await self.close_engine(attempts.engine)
        spare = self.not_engine | ({self.sandbox.server_pid} if self.sandbox and self.sandbox.server_pid else set())
        left = leftovers(os.getpid(), spare)
        if left:
            killed = end_processes(left)
            print(f"the dead engine left {len(left)} processes: ended ({killed} needed SIGKILL)", file=sys.stderr)
        try:
            engine = self.new_engine()
            self._windows_written = 0
            await engine.start()
        except Exception as err:  # noqa: BLE001 - whatever failed, the answers so far are kept
            self.failed = f"the engine could not be restarted ({type(err).__name__}: {err})"
            print(f"{self.failed}: stopping with the answers so far (every finished attempt is in the answer file "
                  "and the log)", file=sys.stderr)
            end_processes(leftovers(os.getpid(), spare))  # a half-started engine's processes
            return False
        attempts.engine = engine
        return True

    async def loop(self, scheduler: Scheduler, attempts: Attempts, log: AttemptLog | None, n_inputs: int) -> None:
        hard_stop = scheduler.config.hard_stop
        running: dict[asyncio.Task, object] = {}
        started: dict[str, float] = {}  # request id -> clock when it started, for the records of aborted attempts
        restarted = False
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, transient=False) as progress:
            bar = progress.add_task("inputs answered", total=n_inputs)
            while self.clock() < hard_stop and not self.stopping:
                while (request := scheduler.next(self.clock())) is not None:
                    running[asyncio.create_task(attempts.run(request))] = request
                    started[request_id(request)] = self.clock()
                self.beat("solving", scheduler, len(running))  # every iteration (at least once a second)
                if not running:
                    break
                done, _ = await asyncio.wait(running, timeout=min(max(hard_stop - self.clock(), 0), 1.0),
                                             return_when=asyncio.FIRST_COMPLETED)  # wakes up for SIGTERM
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
                    if restarted:  # exit 1: boot's supervisor relaunches the solver (--resume) in new processes
                        self.failed = "the engine died again after its restart"
                        print(f"{self.failed}: stopping with the answers so far", file=sys.stderr)
                        break
                    print("the engine died: restarting it once in new processes; its running attempts go back to "
                          "the queue", file=sys.stderr)
                    restarted = True
                    self.stats["engine restarts"] += 1
                    for task, request in running.items():
                        task.cancel()
                        scheduler.on_failed(self.clock(), request)
                    running.clear()
                    if not await self.restart_engine(attempts, scheduler):
                        break
                self.flush_stats(attempts.engine)
                answered = sum(1 for key in self.candidates.by_input if self.candidates.by_input[key])
                progress.update(bar, completed=answered, description=(
                    f"inputs answered | attempts {len(self.finished)} | in flight {len(running)} | "
                    f"{engine_numbers.line(self.measured())}"))
            self.stats[f"aborted at {self.stopping or 'the hard stop'}"] = await self.abort_running(
                scheduler, attempts, log, running, started)
        self.stats["skipped (cap too small)"] = len(scheduler.skipped)

    async def abort_running(self, scheduler: Scheduler, attempts: Attempts, log: AttemptLog | None,
                            running: dict[asyncio.Task, object], started: dict[str, float]) -> int:
        """The hard stop: abort what still runs and log each attempt as aborted. Engines differ in how soon an
        aborted request returns (vLLM: within a step; hf: at its batch's next step, or only when its batch starts),
        so the solver waits a bounded grace for the attempts' own records (their partial tokens; an agent's earlier
        turn keeps its answer) and writes the others itself. Returns how many were logged as aborted."""
        for request in running.values():
            await attempts.engine.abort(request_id(request))
        config = scheduler.config
        grace = min(ABORT_GRACE_S, (config.time_limit_s - config.hard_stop) / 4)
        done = (await asyncio.wait(running, timeout=grace))[0] if running else set()
        aborted = 0
        for task, request in running.items():
            record = None
            if task in done and not task.cancelled() and task.exception() is None:
                record = task.result()
            else:
                task.cancel()
            if record is None or record.finish.startswith("error"):
                record = AttemptRecord(request.task_id, request.test_index, request.attempt, request.level,
                                       request.seed, request.cap, aborted=True, finish="aborted",
                                       started_s=started.get(request_id(request), self.clock()),
                                       finished_s=self.clock())
            self.record(scheduler, record, log, scheduled=record.aborted)
            aborted += record.aborted
        scheduler.abort_all()
        return aborted

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
            f"engine: {engine_numbers.line(self.measured())}",
        ]
        labels = {t.id: t.test_outputs for t in self.tasks.tasks if t.test_outputs is not None}
        if labels:
            lines.append(score_line(render_submission(self.answers.test_counts, self.answers.answers), labels))
        return "\n".join(lines)


def run(args: argparse.Namespace, profile: Profile, new_engine: NewEngine, armed: bool = True) -> int:
    """A reasoning-line profile's run for submission.main's parsed arguments; `armed`: whether the watchdog is."""
    try:
        if args.model:
            profile = replace(profile, engine=replace(profile.engine, model=args.model))
        profile = replace(profile, schedule=with_deadline(profile.schedule, args))
        tasks = run_tasks(args)
    except (LoadError, ValueError) as err:
        return refuse(err)
    if not profile.engine.model:
        return refuse(f"profile {profile.name}: engine.model is empty; pass --model DIR")
    if refuse_old_log(args):
        return 2
    go_offline()
    with watchdog(profile.schedule.time_limit_s, profile.schedule.hard_stop, armed):
        become_subreaper()  # a dead engine's orphaned workers come back to us, to be ended before a restart
        args.out.parent.mkdir(parents=True, exist_ok=True)
        (args.out.parent / "profile.toml").write_text(to_toml(profile))
        for error in tasks.errors:
            print(f"skipped (answered [[0]]): {error}", file=sys.stderr)
        run = Run(args, profile, tasks, new_engine)
        try:
            asyncio.run(run.go())
        finally:
            print(run.summary())
    if run.failed:
        return 1
    return 143 if run.stopping == "SIGTERM" else 0
