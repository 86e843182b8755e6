"""The grid line's run (SPEC section 10): workers on a shared queue, answers rewritten after every task.

A library: submission.lines calls `run` for `python -m submission.main` with a grid-line profile (one with
`line = "grid"`), submission/grid/main.py for `python -m submission.grid.main`, with the grid-only flags. The answer
file exists, complete, before any work starts; the log gets two records per test input (attempt 1 carries every
candidate with its hits, NLL and score). A watchdog (submission.cli's) ends the process before the deadline whatever
the workers do; it is disarmed when the run returns, and `submission.main.main(argv, watchdog=False)` arms none.
SIGTERM (the notebook's rehearsal, once every task has an attempt) starts no new task, ends the running ones and
exits with status 143, the answers so far written. An existing log is refused unless
`--resume`, which continues from it: tasks whose records are all in the log are restored (answers included), never
redone; the others are queued again. The heartbeat file (`--heartbeat`, default beside the log; submission/heartbeat.py)
is rewritten at every worker event (a worker ready, a task started, done or failed) and phase change, counting tasks
(not requests): "engine-start" until the first worker has loaded the model, and a healthy run may go the longest task
limit plus the coordinator's grace without finishing a task (`quiet_s`), which boot's supervisor allows for.
"""

from __future__ import annotations

import argparse
import signal
import sys
from dataclasses import replace
from pathlib import Path

from submission import cli
from submission.answer_file import render_submission
from submission.grid.profile import GridProfile
from submission.grid.format import FormatError, read_format
from submission.tasks import LoadError, TaskSet


def run(args: argparse.Namespace, profile: GridProfile, armed: bool = True) -> int:
    """The run of `profile` for parsed arguments (submission.grid.main's, or submission.main's, which lack the
    grid-only flags); `armed`: whether the watchdog is (submission.cli.watchdog, disarmed when the run returns)."""
    try:
        if args.model:
            profile = replace(profile, model=replace(profile.model, path=str(args.model)))
        if getattr(args, "format", None):
            profile = replace(profile, model=replace(profile.model, format=args.format))
        # --adapter's relative path is the working directory's; the profile's relative model.adapter lies inside
        # the checkpoint (how a bundle carries one)
        if getattr(args, "adapter", None):
            profile = replace(profile, model=replace(profile.model, adapter=str(Path(args.adapter).resolve())))
        if getattr(args, "merge", False):
            profile = replace(profile, model=replace(profile.model, merge=True))
        profile = replace(profile, run=cli.with_deadline(profile.run, args))
        tasks = cli.run_tasks(args)
    except (LoadError, ValueError) as err:
        return cli.refuse(err)
    if not profile.model.path:
        return cli.refuse(f"profile {profile.name}: model.path is empty; pass --model DIR")
    adapter = profile.model.adapter_dir()
    if adapter and not (Path(adapter) / "adapter_config.json").is_file():
        return cli.refuse(f"profile {profile.name}: model.adapter: {adapter}/adapter_config.json is missing (a PEFT "
                          f"adapter folder, training.grid_tune's out/adapter)")
    if profile.model.merge and not profile.model.adapter:
        return cli.refuse(f"profile {profile.name}: model.merge needs model.adapter (--adapter DIR)")
    try:  # the checkpoint's tokenizer must write this format: refused here, before any worker loads weights
        read_format(profile.model.path, profile.model.format)
    except FormatError as err:
        return cli.refuse(err)
    if cli.refuse_old_log(args):
        return 2
    cli.go_offline()
    with cli.watchdog(profile.run.time_limit_s, profile.run.hard_stop, armed):
        return solve(args, profile, tasks)


def solve(args: argparse.Namespace, profile: GridProfile, tasks: TaskSet) -> int:
    """The checked run: the coordinator and its workers, the heartbeat, the summary."""
    from submission.grid.workers import GRACE_S, Coordinator  # torch and the model's code: once the run is checked
    from submission.heartbeat import HeartbeatWriter

    args.out.parent.mkdir(parents=True, exist_ok=True)
    for error in tasks.errors:
        print(f"skipped (answered [[0]]): {error}", file=sys.stderr)
    heartbeat = HeartbeatWriter(cli.heartbeat_path(args))
    heartbeat.beat("loading")
    running: dict[int, str] = {}  # worker -> its task, from the workers' own reports
    finished: list[str] = []
    quiet_s = profile.run.max_task_s + GRACE_S + 60.0  # past this a stuck worker is killed and restarted

    def beat(phase: str) -> None:
        heartbeat.beat(phase, len(coordinator.stats.restored) + len(finished), len(coordinator.queue.pending),
                       len(running), quiet_s=quiet_s)

    def on_event(kind: str, worker: int, task_id: str | None, process) -> None:
        if kind == "started":
            running[worker] = task_id
        elif kind in ("done", "failed"):
            running.pop(worker, None)
            finished.append(task_id)
        beat("solving" if kind == "ready" or heartbeat.phase == "solving" else "engine-start")

    coordinator = Coordinator(profile, tasks, args.out, args.log, resume=args.resume, on_event=on_event)
    beat("engine-start")
    try:
        signal.signal(signal.SIGTERM, lambda *_: coordinator.stop("SIGTERM"))
    except ValueError:  # not the main thread (an in-process caller): SIGTERM keeps its default
        pass
    stats = coordinator.run()
    beat("done")
    answered = sum(1 for pair in coordinator.answers.answers.values() if pair[0] != ((0,),))
    print(f"tasks done: {len(stats.done)} of {len(tasks.tasks)} (restored: {len(stats.restored)}); "
          f"failed: {len(stats.failed)}; workers lost: {len(stats.lost)}; test inputs with an answer: {answered} of "
          f"{sum(tasks.test_counts().values())}; time used: {coordinator.clock():.0f} s")
    labels = {t.id: t.test_outputs for t in tasks.tasks if t.test_outputs is not None}
    if labels:
        print(cli.score_line(render_submission(coordinator.answers.test_counts, coordinator.answers.answers), labels))
    return 143 if coordinator.stopping == "SIGTERM" else 0
