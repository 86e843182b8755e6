"""Training rows: the inference prompt's own token ids, then the completion, with the prompt masked.

    python -m training.dataset --traces traces.jsonl --tasks DIR --model DIR --out rows.jsonl [--profile NAME]
                               [--targets grid|grid+program]

Each row is `input_ids` = prompt ids exactly as the solver sent them (submission.reasoning.prompt.render) + completion
ids, and `labels` = -100 over the prompt, the completion ids after it (what TRL calls a completion mask). The completion
is the recipe's target (`--targets`):
- `grid` (the default, RFT v1, the study's 44.03 model; SPEC 9): the thinking as sampled, `</think>`, the grid, end of
  turn. The program cue and the program are cut off: the study's later sets that added programs did not help.
- `grid+program` (opt-in): the whole completion (grid, cue, program) for traces whose program is train-perfect in the
  sandbox; the others are cut to the grid as above, so an unverified program is never a target.
The grid's tokens are the grid text re-encoded (the sampled ids after `</think>` run into the cue); the thinking's are
the ids as sampled. Pre-tokenised rows built from the inference prompt's ids are the only way to guarantee training
and inference prompts are token-identical (LIBRARIES.md); `check_prompt` re-renders each prompt with the current
tokenizer and template and fails loudly, naming the task and the first differing token, when they are not (a changed
chat template, another tokenizer, or traces sampled under another profile's `[prompt]`: pass the profile the model
will run with, e.g. `--profile dense-27b-4xL4`, whose JSON grids are RFT v1's).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from submission.reasoning.profile import PromptConfig
from submission.reasoning.prompt import render
from submission.tasks import Task
from submission.views import View

IGNORE = -100
TARGETS = ("grid", "grid+program")


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


def grid_part(answer: str) -> str | None:
    """The answer's leading newlines and grid rows with their newline, without what follows (cue, program); None
    when it has no grid. Pure."""
    from submission.reasoning.reply_grammar import parse_answer

    parsed = parse_answer(answer)
    if parsed.grid is None:
        return None
    body = answer.lstrip("\n")
    rows = body.split("\n")[:len(parsed.grid)]
    return answer[:len(answer) - len(body)] + "\n".join(rows) + "\n"


def grid_target(sampled: list[int], answer: str, think_end: int, encode, eos: int) -> list[int]:
    """RFT v1's completion: the sampled ids through `</think>`, the grid re-encoded (`encode`), end of turn. Pure."""
    if think_end not in sampled:
        raise ValueError("a trace without </think> cannot be cut to its grid")
    grid = grid_part(answer)
    if grid is None:
        raise ValueError("a trace without a grid cannot be a target")
    return sampled[:sampled.index(think_end) + 1] + encode(grid) + [eos]


def rows_from_traces(records: list[dict], tasks: dict[str, Task], tokenizer, config: PromptConfig,
                     filters=None, targets: str = "grid", verify=None) -> tuple[list[Row], dict]:
    """Traces (training.traces lines) -> filtered, identity-checked rows, and the filters' drop report. `targets`:
    one of TARGETS; with "grid+program", `verify(program, task) -> bool` says whether a program is train-perfect."""
    from submission.grids import to_grid
    from training.filters import FilterConfig, Trace, select

    traces = []
    for r in records:
        thinking, _, answer = r["text"].partition("</think>")
        traces.append(Trace(r["task_id"], r["test_index"], r["split"], thinking,
                            answer.removesuffix(tokenizer.eos_token or ""), r["natural"],
                            to_grid(r["grid"]) if r["grid"] else None, to_grid(r["label"]),
                            len(r["completion_ids"]), payload=r))
    if targets not in TARGETS or (targets == "grid+program" and verify is None):
        raise ValueError(f"targets must be one of {TARGETS} (grid+program needs a program check), not {targets!r}")
    from submission.reasoning.reply_grammar import THINK_END, parse_answer

    kept, dropped = select(traces, filters or FilterConfig())
    think_end = tokenizer.convert_tokens_to_ids(THINK_END)
    rows = []
    for trace in kept:
        record = trace.payload
        task = tasks.get(record["task_id"])
        if task is not None:  # leave-one-out views are not in the task files: their prompts cannot be re-rendered
            check_prompt(tokenizer, task, record["test_index"], record["prompt_ids"], config)
        program = parse_answer(trace.answer).program
        # a leave-one-out view's program cannot be checked (its task is not in the files): grid only
        verified = targets == "grid+program" and program is not None and task is not None and verify(program, task)
        completion = record["completion_ids"] if verified else grid_target(
            record["completion_ids"], trace.answer, think_end,
            lambda text: tokenizer.encode(text, add_special_tokens=False), tokenizer.eos_token_id)
        rows.append(make_row(record["task_id"], record["test_index"], record["prompt_ids"], completion))
    return rows, dict(dropped)


def write_rows(rows: list[Row], path: str | Path) -> None:
    Path(path).write_text("".join(json.dumps(asdict(row)) + "\n" for row in rows))


def read_rows(path: str | Path) -> list[Row]:
    return [Row(**json.loads(line)) for line in Path(path).read_text().splitlines() if line.strip()]


def main(argv: list[str] | None = None) -> None:
    """Build rows.jsonl from sampled traces (the traces' prompts re-rendered and checked, then masked)."""
    import argparse

    from transformers import AutoTokenizer

    from submission.profiles import load_profile
    from submission.tasks import load_tasks

    parser = argparse.ArgumentParser(prog="python -m training.dataset", description=__doc__.split("\n\n")[0])
    parser.add_argument("--traces", required=True, type=Path)
    parser.add_argument("--tasks", required=True, type=Path)
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--profile", default="cpu-tiny")
    parser.add_argument("--targets", default="grid", choices=TARGETS,
                        help="grid: RFT v1 (thinking + grid); grid+program: programs too, when train-perfect")
    args = parser.parse_args(argv)
    records = [json.loads(line) for line in args.traces.read_text().splitlines() if line.strip()]
    tasks = {t.id: t for t in load_tasks(args.tasks).tasks}
    profile = load_profile(args.profile)
    tokenizer = AutoTokenizer.from_pretrained(args.model)
    if args.targets == "grid":
        rows, dropped = rows_from_traces(records, tasks, tokenizer, profile.prompt)
    else:
        from submission.sandbox.client import Sandbox

        with Sandbox(profile.sandbox) as sandbox:
            rows, dropped = rows_from_traces(records, tasks, tokenizer, profile.prompt, targets=args.targets,
                                             verify=lambda program, task: sandbox.check(program, task).train_perfect)
    write_rows(rows, args.out)
    print(f"{len(records)} traces -> {len(rows)} rows, targets {args.targets} "
          f"({sum(r.prompt_tokens for r in rows)} prompt tokens masked)")
    for why, count in sorted(dropped.items(), key=lambda kv: -kv[1]):
        print(f"  dropped {count:4d}: {why}")


if __name__ == "__main__":
    main()
