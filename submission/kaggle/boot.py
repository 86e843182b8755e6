"""The notebook's entry on Kaggle: install from the bundle with no network, then run the solver, whatever happens.

    python kit/submission/kaggle/boot.py --bundle /kaggle/input/DATASET [--input /kaggle/input] [--competition SLUG]
                                  [--tasks PATH] [--out-dir /kaggle/working] [--work DIR] [--started EPOCH_SECONDS]
                                  [--rehearsal-tasks 3] [--rehearsal-deadline 1800] [--rehearsal-full] [--full-verify]

Standard library only until its own environment is installed (it imports only the kit's standard-library modules).
In order: the competition's test file by its mount name (mounts: a commit run refuses an ambiguous choice) and
a complete `[[0]]` submission.json from it, so the output exists even if everything below fails; the preflight's
machine stage (GPUs, driver); the dataset as mounted, folders in place and the client's archives extracted to `--work`
with every file hashed (bundle_files), then checked against the manifest (sizes of every file, sha256 of the wheels
and the kit; `--full-verify` hashes the model too); an environment of boot's own holding exactly the lock
(locked_install); the full preflight with it (GPU memory, disk, model config against the profile; a refusal stops
here with its report); split files joined into a view of links; then either
- the hidden-set rerun (`KAGGLE_IS_COMPETITION_RERUN`): `submission.main` with the bundle's profile on the test file,
  its deadline counted from the notebook's own start; or
- the commit run, a rehearsal: the same profile on the first `--rehearsal-tasks` public evaluation tasks, the schedule
  scaled to `--rehearsal-deadline` (`--scale-schedule`) so every task gets an attempt, written and scored under
  out-dir/rehearsal/, and ended (SIGTERM) as soon as every task has a finished attempt (`--rehearsal-full`: run to
  the deadline); exit status 3 if the solver fails (the engine did not start) or a task gets no finished attempt;
  it prints what the engine measured (accepted drafts a step, decode tokens/s a request, preemptions) against the
  profile's assumptions, with a WARNING naming the likely cause of each shortfall (submission.engine_numbers);
the solver supervised either way (supervise: relaunched with --resume after a crash, a hang or an endless engine
start, with the bundle's knobs, kit/bundle.json "boot"), and finally the answer file checked task by task, a missing
or broken task given its `[[0]]` slots. Every step boot waits for ends before the time limit (END_MARGIN_S). A
combined bundle (kit/bundle.json `line = "both"`: the reasoning model in model/, the grid model in grid-model/) runs
`submission.both` with both models instead of `submission.main`, and its rehearsal waits for, and checks, each
line's log.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
import tomllib
from pathlib import Path

if __package__ in (None, ""):  # run as a script (kit/submission/kaggle/boot.py): the kit's stdlib-only modules
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from submission import engine_numbers  # noqa: E402
from submission.kaggle import locked_install, mounts  # noqa: E402
from submission.kaggle.bundle_files import (MANIFEST, MODEL_DIRS, disk_needed, join_split_files,  # noqa: E402
                                            manifest_problems, materialise, mounted, top_levels)
from submission.kaggle.mounts import COMPETITION, EVALUATION_FILE, EVALUATION_SOLUTIONS, TEST_FILE  # noqa: E402
from submission.heartbeat import path_for_log  # noqa: E402
from submission.kaggle.supervise import SuperviseConfig, supervise  # noqa: E402

TIME_LIMIT_S = 12 * 3600
END_MARGIN_S = 60.0  # every step boot waits for ends this long before the limit (the solver's deadline twice this)
DISK_MARGIN = 1 << 30  # free disk kept beside the extracted archives (logs, pip's temporary files)
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
           "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1", "PIP_NO_INDEX": "1"}


class BootError(RuntimeError):
    pass


def say(message: str) -> None:
    """One line of boot's log (the notebook's output is the user's only view of a Kaggle run)."""
    print(f"boot: {message}", flush=True)


def remaining(started: float, now: float) -> float:
    """Seconds left of the notebook's time limit."""
    return TIME_LIMIT_S - (now - started)


def step_timeout(started: float, now: float, cap: float) -> float:
    """A timeout for one step that ends `END_MARGIN_S` before the time limit (and after at most `cap` seconds)."""
    return max(1.0, min(cap, remaining(started, now) - END_MARGIN_S))


def solver_deadline(started: float, now: float, rehearsal_s: float | None) -> tuple[float, float]:
    """The solver's --deadline and the timeout boot waits for it. The solver's own watchdog ends it by its deadline,
    which leaves 2 x END_MARGIN_S of the limit; boot's timeout ends END_MARGIN_S before the limit, time enough to check
    the answer file. A rehearsal (`rehearsal_s`) is shorter still."""
    deadline = remaining(started, now) - 2 * END_MARGIN_S
    if rehearsal_s is not None:
        deadline = min(rehearsal_s, deadline)
    return deadline, step_timeout(started, now, deadline + END_MARGIN_S / 2)


def rehearsal_problems(task_ids: list[str], log_lines: list[str]) -> list[str]:
    """What the rehearsal failed to show: tasks with no finished attempt (an aborted or failed one does not count).
    Empty when every task got at least one."""
    finished = {}
    for line in log_lines:
        record = json.loads(line)
        if not record.get("aborted"):
            finished[record["task_id"]] = finished.get(record["task_id"], 0) + 1
    if not finished:
        return [f"no attempt finished on any of the {len(task_ids)} rehearsal tasks"]
    return [f"no attempt finished on task {t}" for t in task_ids if t not in finished]


def run_step(command: list[str], cwd: Path, env: dict, timeout: float, what: str, heartbeat: Path | None = None,
             supervision: SuperviseConfig = SuperviseConfig(), until=None) -> int:
    """The solver under boot's supervisor (submission/kaggle/supervise.py): relaunched with --resume after an abnormal
    exit, a hang or an endless engine start (read from its `heartbeat` file), what it left ended before each relaunch;
    `until()` true ends it with SIGTERM. Its exit status (0 also when `until` ended it); BootError when it outlives
    `timeout` (killed then, its processes with it)."""
    try:
        return supervise(command, "--resume", cwd, env, timeout, heartbeat, supervision, until=until,
                         log=lambda message: print(f"boot: {message}", flush=True))
    except subprocess.TimeoutExpired:
        raise BootError(f"{what} did not end within {timeout:.0f} s (stopped before the time limit)") from None


def own_settings() -> dict:
    """kit/bundle.json of the kit this script runs from (the bundle's profile, line, target and boot settings); {}
    when it cannot be read (the manifest check then says what is wrong)."""
    try:
        return json.loads((Path(os.path.abspath(__file__)).parents[2] / "bundle.json").read_text())
    except (OSError, ValueError):
        return {}


def prepare_answer_file(args: argparse.Namespace, competition: str, rerun: bool) -> tuple[Path | None, dict | None]:
    """The test file (by the competition's mount, submission.kaggle.mounts) and the complete [[0]] answer file written
    from it before anything else, so the output exists whatever fails later. A commit run that cannot tell which test
    file is the competition's raises after the file is written."""
    choice = (mounts.Choice(args.tasks, f"--tasks {args.tasks}") if args.tasks else
              mounts.find(args.input, TEST_FILE, competition, rerun))
    print(f"boot: {choice.note}", flush=True)
    if choice.path is None:
        print(f"boot: no answer file written (is the competition's data attached under {args.input}?)",
              file=sys.stderr)
        return None, None
    fallback = None
    try:
        fallback = mounts.zero_submission(choice.path)
        mounts.write_json(args.out_dir / "submission.json", fallback)
    except (OSError, ValueError) as err:
        print(f"boot: no answer file written: cannot read {choice.path}: {err}", file=sys.stderr)
    if choice.refusal:
        raise BootError(choice.refusal)
    return choice.path, fallback


def machine_preflight(mount: Path, work: Path, timeout: float) -> None:
    """The preflight's machine stage (GPUs, driver against the lock's CUDA) before anything heavy: it needs only the
    standard library, the manifest and the kit, so a wrong machine is refused before gigabytes are extracted and
    installed. Run on a small view: the mounted manifest and the kit this script runs from."""
    if not (mount / MANIFEST).is_file():
        raise BootError(f"{mount}: no {MANIFEST}: not a whole kit dataset (was it uploaded with the command "
                        "build.bundle printed?)")
    view = work / "machine-view"
    shutil.rmtree(view, ignore_errors=True)
    view.mkdir(parents=True)
    os.symlink(mount.resolve() / MANIFEST, view / MANIFEST)
    os.symlink(Path(os.path.abspath(__file__)).parents[2], view / "kit")
    result = subprocess.run([sys.executable, "-m", "submission.kaggle.preflight", "--bundle", str(view), "--stage",
                             "machine"], cwd=view / "kit", capture_output=True, text=True, timeout=timeout)
    print(result.stdout + result.stderr, end="", flush=True)
    if result.returncode != 0:
        raise BootError("the preflight refused this machine (report above)")


def materialised(bundle: Path, work: Path) -> Path:
    """The bundle with every manifest path in place (archives the Kaggle client uploaded and Kaggle kept extracted to
    `work`, hashed as they are written), after a check that the disk holds what extraction writes."""
    manifest = json.loads((bundle / MANIFEST).read_text())
    archived = {top for top in top_levels(manifest) if (found := mounted(bundle, top)) and found.name != top}
    work.mkdir(parents=True, exist_ok=True)
    needed, free = disk_needed(manifest, archived) + DISK_MARGIN, shutil.disk_usage(work).free
    if archived and needed > free:
        raise BootError(f"{work}: {free / 2**30:.1f} GiB free, but extracting {', '.join(sorted(archived))} and "
                        f"joining split files needs {needed / 2**30:.1f} GiB")
    view, problems = materialise(bundle, work)
    if problems:
        raise BootError("the bundle's archives do not match its manifest:\n  " + "\n  ".join(problems[:20]))
    return view


def verify(bundle: Path, full: bool) -> None:
    problems = manifest_problems(bundle, full)
    if problems:
        raise BootError("the bundle does not match its manifest:\n  " + "\n  ".join(problems[:20]))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="boot.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", required=True, type=Path, help="the kit dataset as mounted")
    parser.add_argument("--input", type=Path, default=Path("/kaggle/input"), help="where the competition's data is")
    parser.add_argument("--competition", help=f"the competition's slug (default: the bundle's, else {COMPETITION})")
    parser.add_argument("--tasks", type=Path, help="default: the competition's arc-agi_test_challenges.json")
    parser.add_argument("--out-dir", type=Path, default=Path("/kaggle/working"))
    parser.add_argument("--work", type=Path, help="local disk for boot's environment, extracted archives and "
                        "joined files (default: arc-kit-work beside --out-dir)")
    parser.add_argument("--started", type=float, default=time.time(), help="when the notebook started (epoch s)")
    parser.add_argument("--rehearsal-tasks", type=int, default=3, help="commit run: public evaluation tasks to run")
    parser.add_argument("--rehearsal-deadline", type=float, default=1800.0,
                        help="commit run: the rehearsal's time limit in seconds (engine start included)")
    parser.add_argument("--rehearsal-full", action="store_true",
                        help="commit run: run the rehearsal to its deadline (default: end it once every task has a "
                             "finished attempt)")
    parser.add_argument("--full-verify", action="store_true")
    args = parser.parse_args(argv)
    rerun = bool(os.environ.get("KAGGLE_IS_COMPETITION_RERUN"))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    work = args.work or args.out_dir.parent / "arc-kit-work"
    answer = args.out_dir / "submission.json"
    fallback, status = None, 0
    args.competition = args.competition or own_settings().get("competition") or COMPETITION
    try:
        tasks, fallback = prepare_answer_file(args, args.competition, rerun)
        machine_preflight(args.bundle, work, step_timeout(args.started, time.time(), 300))
        bundle = materialised(args.bundle, work)
        verify(bundle, args.full_verify)
        meta = json.loads((bundle / "kit" / "bundle.json").read_text())
        manifest = json.loads((bundle / MANIFEST).read_text())
        python = locked_install.prepare(sys.executable, work / "venv", bundle / "wheels", manifest["lock"],
                                        step_timeout(args.started, time.time(), 3600), log=say)
        env = dict(locked_install.isolated_env(os.environ), **OFFLINE)  # the image's PYTHONPATH never leaks in
        kit = bundle / "kit"
        preflight = subprocess.run([str(python), "-m", "submission.kaggle.preflight", "--bundle", str(bundle),
                                    "--work", str(work)], cwd=kit, env=env, capture_output=True, text=True,
                                   timeout=step_timeout(args.started, time.time(), 300))
        print(preflight.stdout + preflight.stderr, end="")
        if preflight.returncode != 0:
            raise BootError("the preflight refused this machine or bundle (report above)")
        joined = join_split_files(bundle, work)
        model = joined / MODEL_DIRS[0]
        grid_model = joined / MODEL_DIRS[1] if meta.get("line") == "both" else None
        args.bundle, args.python = bundle, str(python)
        args.supervision = SuperviseConfig(**meta.get("boot", {}))
        if rerun and tasks is None:
            raise BootError(f"the rerun has no {TEST_FILE} under {args.input}")
        if rerun:
            status = solve(args, meta["profile"], model, env, tasks, answer, None, args.out_dir / "attempts.jsonl",
                           grid_model)
        else:
            status = rehearse(args, meta["profile"], model, env, grid_model)
    except (BootError, locked_install.InstallError, OSError, KeyError, TypeError, ValueError,
            subprocess.SubprocessError) as err:
        print(f"boot: {err}", file=sys.stderr)
        status = 3
    if fallback is not None:
        replaced = mounts.keep_complete(answer, fallback)
        if replaced:
            print(f"boot: {len(replaced)} of {len(fallback)} tasks were missing or broken in the answer file: "
                  f"their [[0]] answers written ({', '.join(replaced[:5])}{', ...' if len(replaced) > 5 else ''})",
                  file=sys.stderr)
    return status


def line_logs(out: Path, log: Path, grid_model: Path | None) -> dict[str, Path]:
    """Where the run logs its attempts, by line: `log` for one line; a combined run (a grid model beside the
    reasoning model) logs each line in its folder beside the answer file (submission.both)."""
    if grid_model is None:
        return {"": log}
    return {f"{name} line": out.parent / name / "attempts.jsonl" for name in ("reasoning", "grid")}


def solver_command(profile: str, model: Path, tasks: Path, out: Path, deadline: float, log: Path,
                   grid_model: Path | None, python: str = sys.executable) -> list[str]:
    """submission.main on the bundle's model, or with a combined bundle's grid model submission.both, which
    runs both lines on their shares of the machine and writes the merged answers (each line's log: line_logs);
    `python` is boot's own environment's."""
    if grid_model is None:
        return [python, "-m", "submission.main", "--tasks", str(tasks), "--out", str(out), "--profile",
                profile, "--model", str(model), "--deadline", str(int(deadline)), "--log", str(log)]
    return [python, "-m", "submission.both", "--tasks", str(tasks), "--out", str(out), "--profile",
            profile, "--reasoning-model", str(model), "--grid-model", str(grid_model), "--deadline",
            str(int(deadline))]


def solve(args: argparse.Namespace, profile: str, model: Path, env: dict, tasks: Path, out: Path,
          rehearsal: tuple[int, Path | None, list[str]] | None, log: Path, grid_model: Path | None = None,
          supervision: SuperviseConfig | None = None) -> int:
    """Run the solver (the hidden set, or `rehearsal` = (tasks, solutions, their ids) on a scaled schedule) with
    `args.python` (boot's environment; default this interpreter) under boot's supervisor, its heartbeat beside `log`.
    `supervision` (default `args.supervision`, the bundle's kit/bundle.json "boot" knobs) defaults to: a hang after
    1,800 s with work queued and neither a finished attempt nor a generated token (a running request generates
    tokens every second, a sandbox check takes seconds: 30 quiet minutes are no slow run, and a hang found then
    still leaves hours); an engine start (launch to solving) bounded at 3,600 s (the study's MoE engine was ready
    at ~1,370 s: over twice that is a stuck start, not a slow one); at most 3 relaunches (a fault that comes back
    every time costs at most three engine starts) 30 s apart (the driver frees a killed process's GPU memory; no
    crash loop); none unless an engine start plus 600 s of solving fit in the time left."""
    deadline, timeout = solver_deadline(args.started, time.time(), args.rehearsal_deadline if rehearsal else None)
    if deadline < 1:
        raise BootError(f"no time left for the solver ({deadline:.0f} s before its margins)")
    heartbeat = path_for_log(log)  # submission.main's own default; given to both lines' run too
    supervision = supervision or getattr(args, "supervision", None) or SuperviseConfig()
    command = solver_command(profile, model, tasks, out, deadline, log, grid_model,
                             getattr(args, "python", sys.executable)) + ["--heartbeat", str(heartbeat)]
    if not rehearsal:
        return run_step(command, args.bundle / "kit", env, timeout, "the solver", heartbeat, supervision)
    command += ["--max-tasks", str(rehearsal[0]), "--scale-schedule"]
    command += ["--solutions", str(rehearsal[1])] if rehearsal[1] else []
    return run_rehearsal(command, args.bundle / "kit", env, timeout, None if args.rehearsal_full else
                         (rehearsal[2], list(line_logs(out, log, grid_model).values())), heartbeat, supervision)


def finished_everywhere(task_ids: list[str], logs: list[Path]) -> bool:
    """Whether every log has a finished attempt for every task (a line being written does not count yet)."""
    for log in logs:
        whole = log.read_text().split("\n")[:-1] if log.exists() else []
        if not whole or rehearsal_problems(task_ids, whole):
            return False
    return True


def run_rehearsal(command: list[str], cwd: Path, env: dict, timeout: float,
                  until: tuple[list[str], list[Path]] | None, heartbeat: Path | None = None,
                  supervision: SuperviseConfig = SuperviseConfig()) -> int:
    """The rehearsal's solver, supervised as in the rerun. With `until` = (task ids, logs) it is ended by SIGTERM (it
    aborts what runs, logs it and prints its summary) as soon as every task has a finished attempt in every log (a
    combined run: each line's): that is what a rehearsal must show, and the rest of its deadline would be commit-run
    time spent for nothing. Its exit status is then 0, whether its handler caught the SIGTERM (143) or it died of it
    (a solver already past its handler, shutting down after its last task). A relaunch needs an engine start plus
    `min_solve_s` of time left: with the default knobs a 1,800 s rehearsal has none, so a crash fails the rehearsal
    (as it should: the team learns it before a rerun) instead of being relaunched."""

    def goal_met() -> bool:
        if until is None or not finished_everywhere(*until):
            return False
        print("boot: rehearsal: every task has a finished attempt: ending the solver now (SIGTERM; "
              "--rehearsal-full runs it to its deadline)", flush=True)
        return True

    return run_step(command, cwd, env, timeout, "the solver", heartbeat, supervision, until=goal_met)


def engine_report(log: Path) -> list[str]:
    """What the engine measured in a run (its `<log>.stats.jsonl`) against the profile the solver wrote beside its
    answers (profile.toml): submission.engine_numbers.report. Never raises: a missing or unreadable file is said."""
    stats, profile = log.with_suffix(".stats.jsonl"), log.parent / "profile.toml"
    try:
        return engine_numbers.report(engine_numbers.read_stats(stats), tomllib.loads(profile.read_text()))
    except (OSError, ValueError) as err:  # tomllib.TOMLDecodeError is a ValueError
        return [f"engine: no statistics to report ({type(err).__name__}: {err})"]


def rehearse(args: argparse.Namespace, profile: str, model: Path, env: dict, grid_model: Path | None = None) -> int:
    """The commit run: the bundle's profile on a few public evaluation tasks with the schedule scaled to a short
    deadline, written and scored under out-dir/rehearsal/ (submission.json stays the [[0]] file of the test set).
    Non-zero, with the reason, if the solver fails or a task gets no finished attempt: learn it before a rerun. A
    combined bundle (`grid_model`) rehearses both lines at once, and each line's log must show every task."""
    found = mounts.find(args.input, EVALUATION_FILE, args.competition, rerun=False)
    print(f"boot: rehearsal: {found.note}", flush=True)
    if found.refusal or found.path is None:
        raise BootError(f"rehearsal: {found.refusal or found.note}")
    challenges = found.path
    solutions = challenges.parent / EVALUATION_SOLUTIONS
    solutions = solutions if solutions.exists() else None
    folder = args.out_dir / "rehearsal"
    folder.mkdir(exist_ok=True)
    log = folder / "attempts.jsonl"
    logs = line_logs(folder / "submission.json", log, grid_model)
    for earlier in logs.values():
        earlier.unlink(missing_ok=True)
    print(f"boot: rehearsal (commit run): {args.rehearsal_tasks} tasks of {challenges}, schedule scaled to "
          f"{args.rehearsal_deadline:.0f} s", flush=True)
    ids = sorted(json.loads(challenges.read_text()))[:args.rehearsal_tasks]
    status = solve(args, profile, model, env, challenges, folder / "submission.json",
                   (args.rehearsal_tasks, solutions, ids), log, grid_model)
    problems, logged = [], False
    for line, path in logs.items():
        lines = path.read_text().splitlines() if path.exists() else []
        logged = logged or bool(lines)
        problems += [f"{line}: {p}" if line else p for p in rehearsal_problems(ids, lines)]
    if status != 0:  # -14: its own deadline alarm (SIGALRM) ended it
        problems.insert(0, f"the solver exited with status {status}"
                        + ("" if logged else " before any attempt finished (did the engine start? see above)"))
    for line, path in logs.items():
        for text in engine_report(path) if line != "grid line" else ():  # the grid line runs no vLLM engine
            print(f"boot: rehearsal: {line + ': ' if line else ''}{text}", flush=True)
    if problems:
        raise BootError("rehearsal failed: " + "; ".join(problems))
    print(f"boot: rehearsal ok: every one of {len(ids)} tasks got a finished attempt"
          + (f" in each line's log ({', '.join(logs)})" if grid_model else "") + f" ({folder})", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
