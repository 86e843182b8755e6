"""Shared fixtures: the real ARC data (path overridable with ARC_DATA), a check that tests leave the tree clean, and the
locked vLLM 0.33.0 wheel's source (`v033`), read by the contract tests."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# Never the network: models and tokenizers are local files made by the tests.
for _name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "VLLM_NO_USAGE_STATS", "DO_NOT_TRACK"):
    os.environ.setdefault(_name, "1")
ARC_DATA = Path(os.environ.get("ARC_DATA", REPO.parent / "shared" / "arc-data"))


def pytest_collection_modifyitems(config, items):
    """Tests marked requires_gpu run where torch sees a CUDA GPU and are skipped elsewhere (CI has none)."""
    gpu_items = [item for item in items if "requires_gpu" in item.keywords]
    if not gpu_items:
        return
    try:
        import torch
        have_gpu = torch.cuda.is_available()
    except ImportError:
        have_gpu = False
    if not have_gpu:
        for item in gpu_items:
            item.add_marker(pytest.mark.skip(reason="needs a CUDA GPU"))


@pytest.fixture(scope="session")
def arc_data() -> Path:
    if not (ARC_DATA / "arc-agi-2" / "evaluation").is_dir():
        pytest.fail(f"ARC data not found at {ARC_DATA}: set ARC_DATA to the folder holding arc-agi-2/")
    return ARC_DATA


@pytest.fixture(scope="session", autouse=True)
def tree_stays_clean():
    """Fail the session if a test left files in the repository (outputs belong in tmp_path)."""
    def status() -> str:
        try:
            return subprocess.run(["git", "status", "--porcelain", "--untracked-files=all"], cwd=REPO,
                                  capture_output=True, text=True).stdout
        except FileNotFoundError:  # no git on this machine (a bare GPU box): nothing to compare
            return ""

    before = status()
    yield
    after = status()
    assert after == before, f"tests changed the working tree:\n{after}"


@pytest.fixture(scope="session", autouse=True)
def no_sandbox_folder_left(tmp_path_factory):
    """Fail the session if a sandbox server left its temporary folder: every subprocess of the session (sandbox
    servers included) gets a private TMPDIR, checked at the end. Private, because other runs share /tmp."""
    private = tmp_path_factory.mktemp("tmpdir")
    before = os.environ.get("TMPDIR")
    os.environ["TMPDIR"] = str(private)
    yield
    if before is None:
        del os.environ["TMPDIR"]
    else:
        os.environ["TMPDIR"] = before
    left = sorted(p.name for p in private.glob("arc-sandbox-*"))
    assert not left, f"sandbox servers left their folders: {left}"


@pytest.fixture(scope="session")
def read_tensors():
    """All tensors of a safetensors checkpoint folder, by name (checkpoint-surgery tests compare before and after)."""
    from safetensors import safe_open

    def read(folder: Path) -> dict:
        out = {}
        for file in sorted(Path(folder).glob("*.safetensors")):
            with safe_open(file, framework="pt") as f:
                out.update({name: f.get_tensor(name) for name in f.keys()})
        return out

    return read


@pytest.fixture(scope="module")
def one_torch_thread():
    """One torch thread for a module of many tiny tensor operations: on a shared 2-core machine torch's thread pool
    only adds contention (measured 10x slower training steps, 25 ms per tiny matrix product under load). Skips the
    test where torch is missing (the core environment)."""
    torch = pytest.importorskip("torch")

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


REPLAY_PROFILE = """
[engine]
kind = "replay"
model = "{log}"
replay_time_scale = {scale}

[schedule]
time_limit_s = 600.0
hard_stop_margin_s = 5.0
stop_new_margin_s = 10.0
rate_tok_s = 1000.0
cap_margin_s = 1.0
cap_margin_tokens = 10
min_cap = 100
cap_first_single = 4000
cap_first_multi = 3000
cap_second = 2000
repair_caps = [1500, 1000]
cap_extra = 1000
promote_below_thinking = 1000
repair_min_left_s = 1.0
extra_min_left_s = 1.0
max_in_flight = 3
"""


@pytest.fixture(scope="session")
def replay_profile():
    """Writes a profile for the replay engine: an earlier run's log replayed at a time scale, with small caps and a
    10-minute limit. Shared by the solver's end-to-end, fault and both-lines tests."""
    def write(folder: Path, log: Path, scale: float = 0.0) -> Path:
        path = folder / f"replay-{scale}.toml"
        path.write_text(REPLAY_PROFILE.format(log=log, scale=scale))
        return path
    return write


@pytest.fixture(scope="module")
def v033():
    """vLLM 0.33.0's source as the locked GPU wheel holds it (offline_wheels.source; fetched once into the kit's
    cache, never installed); the test skips, saying why, where the wheel cannot be had."""
    from offline_wheels.source import Source, fetch_wheel

    try:
        return Source(fetch_wheel("kaggle-gpu-py311", "vllm"))
    except (SystemExit, OSError) as err:
        reason = f"the locked vllm 0.33.0 wheel is unavailable, so its source cannot be read: {err}"
        print(reason, file=sys.stderr)
        pytest.skip(reason)
