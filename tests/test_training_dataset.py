"""Training rows: the mask covers exactly the prompt, and the token-identity check fails when the template changes.
Needs transformers (the engine or build environment)."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="rows need a tokenizer (make engine-env)")

from build.tiny import make_tokenizer  # noqa: E402
from submission.config import PromptConfig  # noqa: E402
from submission.prompt import render  # noqa: E402
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
