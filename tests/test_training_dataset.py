"""Training rows: the mask covers exactly the prompt, and the token-identity check fails when the template changes.
Needs transformers (the engine or build environment)."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("transformers", reason="rows need a tokenizer (make engine-env)")

from build.models.tiny import make_tokenizer  # noqa: E402
from submission.reasoning.profile import PromptConfig  # noqa: E402
from submission.reasoning.prompt import render  # noqa: E402
from submission.tasks import load_tasks  # noqa: E402
from training.dataset import IGNORE, PromptMismatch, check_prompt, completion_ids, make_row, read_rows, \
    write_rows  # noqa: E402


@pytest.fixture(scope="module")
def setup(tmp_path_factory, arc_data):
    tokenizer = make_tokenizer(tmp_path_factory.mktemp("tok"))
    task = load_tasks(arc_data / "arc-agi-2" / "training" / "3c9b0459.json").tasks[0]
    return tokenizer, task


def test_mask_covers_exactly_the_prompt(setup, tmp_path):
    tokenizer, task = setup
    prompt = render(tokenizer, task, 0, PromptConfig())[1]
    completion = completion_ids(tokenizer, "The grid is rotated.\n", "\n8 8 8\n")
    row = make_row(task.id, 0, prompt, completion)
    assert row.input_ids[:len(prompt)] == prompt and row.prompt_tokens == len(prompt)
    assert row.labels[len(prompt):] == completion and all(x == IGNORE for x in row.labels[:len(prompt)])
    assert completion[-1] == tokenizer.eos_token_id and tokenizer.convert_tokens_to_ids("</think>") in completion
    write_rows([row], tmp_path / "rows.jsonl")
    assert read_rows(tmp_path / "rows.jsonl") == [row]


def test_identity_check_fails_when_the_template_changes(setup):
    tokenizer, task = setup
    prompt = render(tokenizer, task, 0, PromptConfig())[1]
    check_prompt(tokenizer, task, 0, prompt)  # the same template: fine
    original = tokenizer.chat_template
    tokenizer.chat_template = original.replace("<|im_start|>assistant\\n", "<|im_start|>assistant\\n\\n")
    try:
        with pytest.raises(PromptMismatch, match=f"task {task.id} test 0: .* at token"):
            check_prompt(tokenizer, task, 0, prompt)
    finally:
        tokenizer.chat_template = original
    with pytest.raises(PromptMismatch):
        check_prompt(tokenizer, task, 0, prompt, PromptConfig(system="Be brief."))


def test_traces_resume_and_become_rows(tmp_path, arc_data):
    import json
    import subprocess
    import sys

    from transformers import AutoTokenizer

    from build.models.tiny import make_checkpoint
    from training.dataset import rows_from_traces

    model = make_checkpoint(tmp_path / "model", "qwen3", seed=0)
    command = [sys.executable, "-m", "training.traces", "--model", str(model), "--tasks",
               str(arc_data / "arc-agi-2" / "training" / "3c9b0459.json"), "--attempts", "2", "--cap", "40",
               "--inject-known", "--out", str(tmp_path / "traces.jsonl")]
    repo = Path(__file__).resolve().parents[1]
    first = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=600)
    assert first.returncode == 0, first.stderr[-2000:]
    again = subprocess.run(command, cwd=repo, capture_output=True, text=True, timeout=600)
    assert "0 traces" in again.stdout and "(3 already there)" in again.stdout
    records = [json.loads(line) for line in (tmp_path / "traces.jsonl").read_text().splitlines()]
    assert sorted(r["attempt"] for r in records) == [0, 1, 2] and [r["injected"] for r in records].count(True) == 1
    tokenizer = AutoTokenizer.from_pretrained(model)
    task = load_tasks(arc_data / "arc-agi-2" / "training" / "3c9b0459.json").tasks[0]
    sampled = next(r for r in records if r["attempt"] == 1)
    assert sampled["prompt_ids"] == render(tokenizer, task, 0, PromptConfig())[1]
    assert tokenizer.decode(sampled["completion_ids"]) == sampled["text"]  # the ids as sampled
    assert sampled["seed"] != next(r for r in records if r["attempt"] == 2)["seed"]
    rows, dropped = rows_from_traces(records, {task.id: task}, tokenizer, PromptConfig())
    assert len(rows) == 1 and sum(dropped.values()) == 2  # only the injected, correct trace survives


def test_leave_one_out_views(arc_data):
    from training.traces import leave_one_out

    task = load_tasks(arc_data / "arc-agi-2" / "evaluation").tasks[0]
    views = leave_one_out(task)
    assert len(views) == len(task.test_inputs) * len(task.train)
    first = views[0]
    assert first.train[-1].input == task.test_inputs[0] and first.test_inputs == (task.train[0].input,)
    assert first.test_outputs == (task.train[0].output,) and len(first.train) == len(task.train)


@pytest.mark.parametrize("targets, verified, program_kept", [
    ("grid", True, False),  # RFT v1: never the program, even a train-perfect one
    ("grid+program", True, True),
    ("grid+program", False, False),  # an unverified program is never a target
])
def test_rft_v1_targets_cut_the_cue_and_program(setup, targets, verified, program_kept):
    from submission.reasoning.profile import EngineConfig
    from training.dataset import rows_from_traces
    from training.traces import known_trace

    tokenizer, task = setup
    prompt = render(tokenizer, task, 0, PromptConfig())[1]
    trace = known_trace(tokenizer, task, 0, prompt, EngineConfig().program_cue)
    record = {"task_id": task.id, "test_index": 0, "split": "training", "prompt_ids": prompt,
              "completion_ids": trace["token_ids"], "text": tokenizer.decode(trace["token_ids"]), "natural": True,
              "grid": [list(r) for r in task.test_outputs[0]], "label": [list(r) for r in task.test_outputs[0]]}
    checked = []
    rows, _ = rows_from_traces([record], {task.id: task}, tokenizer, PromptConfig(), targets=targets,
                               verify=lambda program, t: checked.append(program) or verified)
    completion = tokenizer.decode(rows[0].labels[len(prompt):])
    grid = "\n".join(" ".join(map(str, r)) for r in task.test_outputs[0])
    assert completion.startswith("Injected known-correct trace") and f"</think>\n{grid}\n" in completion
    assert completion.endswith(tokenizer.eos_token)
    assert ("def transform(grid):" in completion) is program_kept
    assert bool(checked) is (targets == "grid+program")
    if not program_kept:
        assert completion.endswith(f"</think>\n{grid}\n{tokenizer.eos_token}")
