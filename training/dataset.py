"""Training rows: the inference prompt's own token ids, then the completion, with the prompt masked.

    python -m training.dataset --traces traces.jsonl --tasks DIR --model DIR --out rows.jsonl [--profile NAME]

Each row is `input_ids` = prompt ids exactly as the solver sent them (submission.prompt.render) + completion ids
(thinking, `</think>`, grid, cue, program, end of turn), and `labels` = -100 over the prompt, the completion ids
after it (what TRL calls a completion mask). Pre-tokenised rows built from the inference prompt's ids are the only
way to guarantee training and inference prompts are token-identical (LIBRARIES.md); `check_prompt` re-renders each
prompt with the current tokenizer and template and fails loudly, naming the task and the first differing token,
when they are not (a changed chat template, another tokenizer).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from submission.config import PromptConfig
from submission.prompt import render
from submission.tasks import Task
from submission.views import View

IGNORE = -100


class PromptMismatch(ValueError):
    """A stored prompt that the current tokenizer and template no longer render identically."""


@dataclass(frozen=True)
class Row:
    task_id: str
    test_index: int
    input_ids: list[int]
    labels: list[int]

    @property
    def prompt_tokens(self) -> int:
        return sum(1 for label in self.labels if label == IGNORE)


def make_row(task_id: str, test_index: int, prompt_ids: list[int], completion_ids: list[int]) -> Row:
    """Pure: the prompt masked, the completion supervised."""
    if not completion_ids:
        raise ValueError(f"task {task_id} test {test_index}: empty completion")
    return Row(task_id, test_index, list(prompt_ids) + list(completion_ids),
               [IGNORE] * len(prompt_ids) + list(completion_ids))


def check_prompt(tokenizer, task: Task, test_index: int, prompt_ids: list[int], config: PromptConfig = PromptConfig(),
                 view: View = View()) -> None:
    fresh = render(tokenizer, task, test_index, config, view)[1]
    if fresh != list(prompt_ids):
        first = next((i for i, (a, b) in enumerate(zip(fresh, prompt_ids)) if a != b), min(len(fresh),
                                                                                          len(prompt_ids)))
        raise PromptMismatch(f"task {task.id} test {test_index}: the stored prompt ({len(prompt_ids)} tokens) differs "
                             f"from today's rendering ({len(fresh)} tokens) at token {first}: the chat template or "
                             "tokenizer changed since the traces were made")


def completion_ids(tokenizer, thinking: str, answer: str) -> list[int]:
    """Token ids of a completion from its text: thinking, `</think>`, the answer, end of turn."""
    text = f"{thinking}</think>{answer}"
    return tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]


def rows_from_traces(records: list[dict], tasks: dict[str, Task], tokenizer, config: PromptConfig,
                     filters=None) -> tuple[list[Row], dict]:
    """Traces (training.traces lines) -> filtered, identity-checked rows, and the filters' drop report."""
    from submission.grids import to_grid
    from training.filters import FilterConfig, Trace, select

    traces = []
    for r in records:
        thinking, _, answer = r["text"].partition("</think>")
        traces.append(Trace(r["task_id"], r["test_index"], r["split"], thinking,
                            answer.removesuffix(tokenizer.eos_token or ""), r["natural"],
                            to_grid(r["grid"]) if r["grid"] else None, to_grid(r["label"]),
                            len(r["completion_ids"]), payload=r))
    kept, dropped = select(traces, filters or FilterConfig())
    rows = []
    for trace in kept:
        record = trace.payload
        task = tasks.get(record["task_id"])
        if task is not None:  # leave-one-out views are not in the task files: their prompts cannot be re-rendered
            check_prompt(tokenizer, task, record["test_index"], record["prompt_ids"], config)
        rows.append(make_row(record["task_id"], record["test_index"], record["prompt_ids"], record["completion_ids"]))
    return rows, dict(dropped)


def write_rows(rows: list[Row], path: str | Path) -> None:
    Path(path).write_text("".join(json.dumps(asdict(row)) + "\n" for row in rows))


def read_rows(path: str | Path) -> list[Row]:
    return [Row(**json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> None:
    """Build rows.jsonl from sampled traces (the traces' prompts re-rendered and checked, then masked)."""
    import argparse

    from transformers import AutoTokenizer

    from submission.config import load_profile
    from submission.tasks import load_tasks

    parser = argparse.ArgumentParser(prog="python -m training.dataset", description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", required=True, type=Path)
    parser.add_argument("--tasks", required=True, type=Path)
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--profile", default="cpu-tiny")
    args = parser.parse_args(argv)
    records = [json.loads(line) for line in args.traces.read_text().splitlines() if line.strip()]
    tasks = {t.id: t for t in load_tasks(args.tasks).tasks}
    rows, dropped = rows_from_traces(records, tasks, AutoTokenizer.from_pretrained(args.model),
                                     load_profile(args.profile).prompt)
    write_rows(rows, args.out)
    print(f"{len(records)} traces -> {len(rows)} rows ({sum(r.prompt_tokens for r in rows)} prompt tokens masked)")
    for why, count in sorted(dropped.items(), key=lambda kv: -kv[1]):
        print(f"  dropped {count:4d}: {why}")


if __name__ == "__main__":
    main()
