"""The Kaggle rehearsal and its failure matrix (issue 27): the CPU bundle, uploaded by the real Kaggle client
(`kaggle datasets create --dir-mode tar`, intercepted only at the network call: tests/kaggle_client.py), mounted as
Kaggle mounts it (archives kept, or unpacked) read-only with the network cut, the notebook's cells run as Kaggle runs
them (tests/kaggle_box.py): the commit run, then the competition rerun. Every row names what happened and passes only
with a complete answer file (every task, every test input, two attempts, valid grids).

One bundle build and one upload serve every row; boot's environment is installed once and reused by the rows after
(`make kaggle-rehearsal FULL=1` gives each row a fresh install: ARC_KIT_REHEARSAL_FULL=1). Needs the build
environment (the kaggle client, torch for the tiny model) and the CPU target's wheels (~500 MB, fetched once).
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from kaggle_box import Box, Fault, answer_problems, answered, namespaces_allowed, stop_leftovers  # noqa: E402
from kaggle_client import kaggle_cli, mount, upload  # noqa: E402

# The client's console script, not find_spec("kaggle"): from the repository root that finds its kaggle/ folder.
if kaggle_cli() is None or importlib.util.find_spec("torch") is None:
    pytest.skip("the Kaggle rehearsal needs the build environment (the kaggle client, torch)",
                allow_module_level=True)

FULL = os.environ.get("ARC_KIT_REHEARSAL_FULL") == "1"
SLUG = "arc-kit-bundle"  # the kit dataset's slug as uploaded; the notebook finds it by its files, not its name
# Boot's supervision bounds for the tiny model: an engine loads in seconds here and a hang shows within a minute.
BOOT = {"hang_s": 45, "engine_start_s": 300, "max_restarts": 2, "restart_spacing_s": 2, "kill_grace_s": 5}


@pytest.fixture(scope="module")
def tasks(arc_data) -> tuple[dict, dict]:
    """The two smallest ARC-AGI-2 evaluation tasks as the hidden test set (challenges without outputs) and their
    solutions."""
    files = sorted((arc_data / "arc-agi-2" / "evaluation").glob("*.json"), key=lambda f: f.stat().st_size)[:2]
    raw = {f.stem: json.loads(f.read_text()) for f in files}
    return ({t: {"train": v["train"], "test": [{"input": p["input"]} for p in v["test"]]} for t, v in raw.items()},
            {t: [p["output"] for p in v["test"]] for t, v in raw.items()})


@pytest.fixture(scope="module")
def uploaded(tmp_path_factory) -> Path:
    """The CPU bundle as the real client uploaded it: manifest.json and one tar per top-level folder."""
    from build.bundle.bundler import bundle
    from build.models.tiny import make_checkpoint

    root = tmp_path_factory.mktemp("shipped")
    model = make_checkpoint(root / "model", "qwen3", seed=0)
    made = bundle("cpu-tiny", model, root / "bundle", target="cpu-py311", dataset_id=f"someone/{SLUG}", boot=BOOT)
    sent = upload(made, root / "client", "tar")
    assert sent.names == ["kit.tar", "manifest.json", "model.tar", "wheels.tar"]
    return sent.folder


@pytest.fixture(scope="module")
def box(tmp_path_factory) -> Box:
    made = Box(tmp_path_factory.mktemp("kaggle"))
    yield made
    stop_leftovers(str(made.working))


def fresh_session(box: Box, uploaded: Path | None, unpack: bool = False, slug: str = SLUG) -> None:
    """A new notebook session: empty input and working folders, the kit dataset attached (None: not attached).
    Boot's installed environment is kept unless FULL."""
    for folder in (box.input, box.working):
        if folder.exists():
            for path in sorted(folder.rglob("*"), reverse=True):
                if not path.is_symlink():
                    path.chmod(0o755 if path.is_dir() else 0o644)
            shutil.rmtree(folder)
        folder.mkdir()
    if FULL:
        shutil.rmtree(box.work, ignore_errors=True)
    if uploaded is not None:
        mount(uploaded, box.input, slug, unpack=unpack)


def with_a_task_without_tests(challenges: dict) -> dict:
    return dict(challenges, notests0={"train": next(iter(challenges.values()))["train"]})


def log_keys(path: Path) -> list[tuple]:
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [(r["task_id"], r["test_index"], r["attempt"]) for r in records if not r["aborted"]]


@pytest.mark.timeout(1800)
def test_commit_run_on_a_conflicting_image_rehearses_from_the_clients_archives(box, uploaded, tasks, tmp_path):
    """The commit run on what the client sent with Kaggle keeping the archives (boot extracts and hashes them), from
    an image Python with its own versions of two locked packages (rich 1.0 and filelock 0.1: stand-ins without the
    modules the solver imports), with the 2024 competition attached beside 2025's and a test task without "test".
    Boot installs the whole lock into its own environment and checks every version; the rehearsal passes (nothing of
    the image leaked into the solver), the answer file is the complete [[0]] file of 2025's test set, and boot says
    which mount it took. The rows after reuse this installed environment (unless FULL)."""
    from test_locked_install import make_wheel

    challenges, solutions = tasks
    fresh_session(box, uploaded, unpack=False)
    shutil.rmtree(box.work, ignore_errors=True)  # this row's point is the install, whatever ran before
    seed = [make_wheel(tmp_path / "seed", name, version, []) for name, version in (("rich", "1.0"),
                                                                                  ("filelock", "0.1"))]
    image = box.image(seed, name="image-seeded")
    seen = subprocess.run([str(image), "-c", "import rich, filelock; print(rich.__version__, filelock.__version__)"],
                          capture_output=True, text=True)
    assert seen.stdout.split() == ["1.0", "0.1"]  # the image really has them
    test_set = with_a_task_without_tests(challenges)
    box.attach_competition("arc-prize-2025", test_set, solutions, evaluation=challenges)
    old = {"old-2024-task": next(iter(challenges.values()))}
    box.attach_competition("arc-prize-2024", old, {})
    try:
        result = box.run_notebook(rerun=False)
    finally:
        box.image()  # the other rows' image, without the seeded packages
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert answer_problems(box.answer, test_set) == []
    assert "all 45 locked distributions verified" in result.stdout
    assert "extracting" in result.stdout and "rehearsal ok: every one of 2 tasks" in result.stdout
    assert "the competition's mount arc-prize-2025; also attached, not used:" in result.stdout
    assert "score: task-weighted" in result.stdout
    # what the engine measured, against the profile (cpu-tiny's hf engine has no drafts: said so, never 0 accepted)
    assert "boot: rehearsal: engine: no drafts | decode " in result.stdout
    assert "(the profile assumes no drafts, >= " in result.stdout


@pytest.mark.timeout(1800)
def test_rerun_with_the_solver_killed_is_resumed_and_keeps_both_lives(box, uploaded, tasks):
    """The rerun on the unpacked layout; the solver is SIGKILLed once its first attempt is logged: boot relaunches
    it with --resume, and the answer file ends complete with the answers of both lives, nothing redone."""
    challenges, _ = tasks
    fresh_session(box, uploaded, unpack=True)
    box.attach_competition("arc-prize-2025", challenges, evaluation=False)
    result = box.run_notebook(rerun=True, fault=Fault("solver killed", signal.SIGKILL))
    assert result.returncode == 0 and result.signalled, result.stdout[-3000:] + result.stderr[-3000:]
    assert answer_problems(box.answer, challenges) == []
    assert "--resume" in result.stdout + result.stderr
    keys = log_keys(box.working / "attempts.jsonl")
    assert len(keys) == len(set(keys)), "an attempt was redone"
    assert answered(box.answer) == sum(len(t["test"]) for t in challenges.values())


@pytest.mark.timeout(1800)
def test_an_engine_hang_is_detected_and_the_solver_relaunched(box, uploaded, tasks):
    """The solver stops (SIGSTOP) after its first logged attempt: no attempt and no token for hang_s while work is
    queued, so boot ends it and relaunches it with --resume."""
    challenges, _ = tasks
    one = dict([next(iter(challenges.items()))])
    fresh_session(box, uploaded, unpack=True)
    box.attach_competition("arc-prize-2025", one, evaluation=False)
    result = box.run_notebook(rerun=True, fault=Fault("engine hang", signal.SIGSTOP))
    assert result.returncode == 0 and result.signalled, result.stdout[-3000:] + result.stderr[-3000:]
    assert "hang" in (result.stdout + result.stderr).lower()
    assert answer_problems(box.answer, one) == [] and answered(box.answer) >= 1


@pytest.mark.parametrize("rerun", [False, True], ids=["commit", "rerun"])
def test_no_kit_dataset_leaves_the_zero_file(box, tasks, rerun):
    challenges, _ = tasks
    fresh_session(box, None)
    box.attach_competition("arc-prize-2025", challenges)
    result = box.run_notebook(rerun=rerun)
    assert answer_problems(box.answer, challenges) == [] and answered(box.answer) == 0
    assert "no kit dataset" in result.stderr
    assert result.returncode == (0 if rerun else 1)


def test_two_other_competitions_and_not_the_bundles_fail_the_commit_with_their_paths(box, uploaded, tasks):
    challenges, _ = tasks
    fresh_session(box, uploaded, unpack=True)
    for slug in ("arc-prize-2024", "arc-prize-2023"):
        box.attach_competition(slug, challenges)
    result = box.run_notebook(rerun=False)
    assert result.returncode == 1 and "none under the competition's mount arc-prize-2025" in result.stderr
    assert str(box.input / "arc-prize-2023" / "arc-agi_test_challenges.json") in result.stderr
    assert answer_problems(box.answer, challenges) == []


@pytest.mark.parametrize("unpack", [False, True], ids=["archive", "folder"])
def test_a_corrupt_wheel_fails_naming_it_and_keeps_the_zero_file(box, uploaded, tasks, tmp_path, unpack):
    challenges, _ = tasks
    import tarfile

    with tarfile.open(uploaded / "wheels.tar") as t:
        member = next(m for m in t.getmembers() if m.name.startswith("rich-"))
    corrupt = tmp_path / "uploaded"
    shutil.copytree(uploaded, corrupt, copy_function=os.link)
    (corrupt / "wheels.tar").unlink()
    shutil.copy(uploaded / "wheels.tar", corrupt / "wheels.tar")
    with open(corrupt / "wheels.tar", "r+b") as f:  # one byte of the wheel's data, its size unchanged
        f.seek(member.offset_data + member.size // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    fresh_session(box, corrupt, unpack=unpack)
    box.attach_competition("arc-prize-2025", challenges)
    result = box.run_notebook(rerun=False)
    assert result.returncode == 1 and f"sha256 differs: wheels{'/' if unpack else '.tar:'}{member.name}" \
        in result.stderr, result.stderr[-3000:]
    assert answer_problems(box.answer, challenges) == [] and answered(box.answer) == 0


@pytest.mark.skipif(not namespaces_allowed(), reason="a full working disk needs a mount namespace (unshare -m)")
@pytest.mark.timeout(1800)
def test_a_full_working_disk_keeps_the_complete_answer_file(box, uploaded, tasks):
    """/kaggle/working fills up right after cell 1 wrote the [[0]] file: every later write fails (ENOSPC), the run
    goes on, and the [[0]] file stands complete."""
    challenges, _ = tasks
    one = dict([next(iter(challenges.items()))])
    fresh_session(box, uploaded, unpack=True)
    box.attach_competition("arc-prize-2025", one, evaluation=False)
    result = box.run_notebook(rerun=True, fault=Fault("working disk full", disk_full=True))
    assert "working disk filled" in result.stdout, result.stdout[-2000:] + result.stderr[-2000:]
    assert result.returncode == 0, result.stderr[-3000:]
    assert answer_problems(box.answer, one) == []  # as the notebook ended, copied out of its tmpfs
