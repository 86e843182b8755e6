"""The prompt renderer, shared by the solver and training so that both send token-identical prompts.

A task is written "row-wise with sizes" by default (SPEC section 2: it beat JSON grids by about 5 points): every grid
is preceded by its size `RxC` and written one row per line, digits separated by spaces. `grid_format = "json"` writes
each grid as a JSON list of rows instead, as RFT v1's traces and the dense 44.03 run did (study ~1925, ~3510); the
answer after </think> is rows in both (the grid grammar). The text goes through the model's own chat
template with thinking on (and a reasoning effort where the template takes one). A view (submission.views) changes
what is shown: the second attempt reorders the demonstrations.
"""

from __future__ import annotations

import json
from typing import Any, Protocol

from submission.reasoning.profile import PromptConfig
from submission.reasoning.reply_grammar import THINK_START
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


def json_grid_text(grid: Grid) -> str:
    """The grid as a JSON list of rows on one line: `[[0, 1], [2, 3]]`."""
    return json.dumps([list(row) for row in grid])


def prompt_grid_text(grid: Grid, config: PromptConfig) -> str:
    """A grid of the task as the prompt writes it (`config.grid_format`)."""
    return json_grid_text(grid) if config.grid_format == "json" else sized_grid_text(grid)


def task_text(task: Task, test_index: int, config: PromptConfig, view: View = View()) -> str:
    """The user message for one test input of a task, under a view. Pure."""
    shown = view.apply(task)
    parts = [config.instruction, ""]
    for number, pair in enumerate(shown.train, 1):
        parts += [f"Example {number}", "Input:", prompt_grid_text(pair.input, config), "Output:",
                  prompt_grid_text(pair.output, config), ""]
    parts += ["Test input:", prompt_grid_text(shown.test_inputs[test_index], config)]
    return "\n".join(parts)


def messages(task: Task, test_index: int, config: PromptConfig, view: View = View(),
             extra: str = "") -> list[dict[str, str]]:
    out = [{"role": "system", "content": config.system}] if config.system else []
    return out + [{"role": "user", "content": task_text(task, test_index, config, view) + extra}]


def _template_options(config: PromptConfig) -> dict[str, Any]:
    """Thinking on, and the reasoning effort where the profile sets one (templates that take none ignore it)."""
    return {"enable_thinking": True, **({"reasoning_effort": config.reasoning_effort} if config.reasoning_effort else {})}


def render(tokenizer: ChatTokenizer, task: Task, test_index: int, config: PromptConfig,
           view: View = View(), extra: str = "") -> tuple[str, list[int]]:
    """The prompt text through the chat template (generation prompt, thinking on) and its token ids. `extra` is
    appended to the user message (the repair turn's program and differences)."""
    text = tokenizer.apply_chat_template(messages(task, test_index, config, view, extra), tokenize=False,
                                         add_generation_prompt=True, **_template_options(config))
    return text, tokenizer.encode(text, add_special_tokens=False)


def example_lines(demo_results: list[tuple[Grid, Grid | None, str]], max_cells: int = 12) -> list[str]:
    """One line per demonstration: reproduced, no grid (why), the wrong shape, or the cell-level differences (up to
    `max_cells`). `demo_results` holds (expected output, produced output or None, status or error message). Pure."""
    lines = []
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
    return lines


def repair_text(program: str, demo_results: list[tuple[Grid, Grid | None, str]], max_cells: int = 12) -> str:
    """The repair turn's addition (L2): the best program so far and its results on each demonstration. Pure."""
    lines = ["", "A previous attempt wrote this program:", "```python", program.rstrip(), "```",
             "Its results on the examples:"]
    lines += example_lines(demo_results, max_cells)
    lines.append("Correct the rule, then answer for the test input as before.")
    return "\n".join(lines)


FIX = "Fix the program if it is wrong, then check it again or answer for the test input as before."


def check_text(demo_results: list[tuple[Grid, Grid | None, str]], test_output: Grid | None, test_note: str,
               failing_pairs: int = 2, max_cells: int = 12, test_output_max_cells: int = 225,
               grids: bool = True, closing: str = FIX) -> str:
    """The tool agent's tool turn: check_transform's results on each demonstration (as in the repair turn), the
    expected and produced grids of the first `failing_pairs` failing ones (when `grids`), and the program's output
    for the test input when it has at most `test_output_max_cells` cells (`test_note` says why there is none), then
    the `closing` line. Pure."""
    right = sum(expected == produced for expected, produced, _ in demo_results)
    lines = [f"check_transform: {right} of {len(demo_results)} examples reproduced."]
    lines += example_lines(demo_results, max_cells)
    if grids:
        failing = [(n, e, p) for n, (e, p, _) in enumerate(demo_results, 1) if e != p][:failing_pairs]
        for number, expected, produced in failing:
            lines += [f"Example {number} expected:", sized_grid_text(expected)]
            if produced is not None:
                lines += [f"Example {number} produced:", sized_grid_text(produced)]
    if test_output is None:
        lines.append(f"Test input: no grid ({test_note}).")
    elif len(test_output) * len(test_output[0]) <= test_output_max_cells:
        lines += ["Test input produced:", sized_grid_text(test_output)]
    else:
        lines.append(f"Test input: produced a {len(test_output)}x{len(test_output[0])} grid.")
    lines.append(closing)
    return "\n".join(lines)


def tool_turn(tokenizer: ChatTokenizer, content: str, config: PromptConfig) -> tuple[str, list[int]]:
    """What follows an assistant turn's end-of-turn token when a tool answers: the rest of that turn's closing, the
    tool turn and the next generation prompt, exactly as the model's chat template writes them.

    Rendered as the difference of two conversations (with and without the tool message), so any template works whose
    earlier turns do not change when a tool message is appended; one that does is refused. The assistant turn carries
    reasoning so that templates which drop the thinking of earlier turns (Qwen3's) render it the same in both."""
    kwargs = _template_options(config)
    base = [{"role": "user", "content": "task"}, {"role": "assistant", "content": "answer", "reasoning_content": "r"}]
    before = tokenizer.apply_chat_template(base, tokenize=False, **kwargs)
    after = tokenizer.apply_chat_template(base + [{"role": "tool", "content": content}], tokenize=False,
                                          add_generation_prompt=True, **kwargs)
    end = before.rfind("answer") + len("answer")
    if not after.startswith(before) or end < len("answer"):
        raise ValueError("chat template: appending a tool message changes the turns before it; the tool agent "
                         "needs a template that only appends")
    text = after[end:]  # from the assistant's end-of-turn marker on
    if THINK_START not in text:
        # Hybrid templates (Qwen3's) leave `<think>` to the model. Here it is written: the model would open with it,
        # and a prompt whose last think marker is the previous turn's `</think>` reads to vLLM as reasoning ended.
        text += THINK_START + "\n"
    ids = tokenizer.encode(text, add_special_tokens=False)
    return text, ids
