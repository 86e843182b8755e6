"""The prompt renderer, shared by the solver and training so that both send token-identical prompts.

A task is written "row-wise with sizes" (SPEC section 2: it beat JSON grids by about 5 points): every grid is preceded
by its size `RxC` and written one row per line, digits separated by spaces. The text goes through the model's own chat
template with thinking on (and a reasoning effort where the template takes one). A view (submission.views) changes
what is shown: the second attempt reorders the demonstrations.
"""

from __future__ import annotations

from typing import Any, Protocol

from submission.config import PromptConfig
from submission.grids import Grid
from submission.tasks import Task
from submission.views import View


class ChatTokenizer(Protocol):
    """What the renderer needs of a tokenizer (transformers' tokenizers have it)."""

    def apply_chat_template(self, conversation: list[dict[str, str]], **kwargs: Any) -> Any: ...

    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...


def grid_text(grid: Grid) -> str:
    """Rows of space-separated digits, one per line, no size line (the answer format after </think>)."""
    return "\n".join(" ".join(map(str, row)) for row in grid)


def sized_grid_text(grid: Grid) -> str:
    return f"{len(grid)}x{len(grid[0])}\n{grid_text(grid)}"


def task_text(task: Task, test_index: int, config: PromptConfig, view: View = View()) -> str:
    """The user message for one test input of a task, under a view. Pure."""
    shown = view.apply(task)
    parts = [config.instruction, ""]
    for number, pair in enumerate(shown.train, 1):
        parts += [f"Example {number}", "Input:", sized_grid_text(pair.input), "Output:", sized_grid_text(pair.output),
                  ""]
    parts += ["Test input:", sized_grid_text(shown.test_inputs[test_index])]
    return "\n".join(parts)


def messages(task: Task, test_index: int, config: PromptConfig, view: View = View(),
             extra: str = "") -> list[dict[str, str]]:
    out = [{"role": "system", "content": config.system}] if config.system else []
    return out + [{"role": "user", "content": task_text(task, test_index, config, view) + extra}]


def render(tokenizer: ChatTokenizer, task: Task, test_index: int, config: PromptConfig,
           view: View = View(), extra: str = "") -> tuple[str, list[int]]:
    """The prompt text through the chat template (generation prompt, thinking on) and its token ids. `extra` is
    appended to the user message (the repair turn's program and differences)."""
    kwargs: dict[str, Any] = {"enable_thinking": True}
    if config.reasoning_effort:
        kwargs["reasoning_effort"] = config.reasoning_effort
    text = tokenizer.apply_chat_template(messages(task, test_index, config, view, extra), tokenize=False,
                                         add_generation_prompt=True, **kwargs)
    return text, tokenizer.encode(text, add_special_tokens=False)


def repair_text(program: str, demo_results: list[tuple[Grid, Grid | None, str]], max_cells: int = 12) -> str:
    """The repair turn's addition (L2): the best program so far and, per demonstration, whether it reproduced the
    output, else the cell-level differences (up to `max_cells`), the shape mismatch or the error. Pure.

    `demo_results` holds (expected output, produced output or None, status or error message) per demonstration."""
    lines = ["", "A previous attempt wrote this program:", "```python", program.rstrip(), "```",
             "Its results on the examples:"]
    for number, (expected, produced, note) in enumerate(demo_results, 1):
        if produced == expected:
            lines.append(f"Example {number}: correct.")
        elif produced is None:
            lines.append(f"Example {number}: no grid ({note}).")
        elif (len(produced), len(produced[0])) != (len(expected), len(expected[0])):
            lines.append(f"Example {number}: produced a {len(produced)}x{len(produced[0])} grid, expected "
                         f"{len(expected)}x{len(expected[0])}.")
        else:
            diffs = [(r, c, expected[r][c], produced[r][c]) for r in range(len(expected))
                     for c in range(len(expected[0])) if expected[r][c] != produced[r][c]]
            shown = ", ".join(f"({r},{c}) expected {e} got {p}" for r, c, e, p in diffs[:max_cells])
            more = f" and {len(diffs) - max_cells} more" if len(diffs) > max_cells else ""
            lines.append(f"Example {number}: {len(diffs)} cells differ (row, column): {shown}{more}.")
    lines.append("Correct the rule, then answer for the test input as before.")
    return "\n".join(lines)
