"""The tool agent (SPEC section 5): a first attempt that checks its programs on the demonstrations between turns.

Every turn is one ordinary request: thinking up to the turn's cap (the forced close at the cap), then the answer
grammar's grid and `transform` program. The answer's program is the `check_transform` call: the kit runs it on the
demonstrations and, while checks remain and it is not train-perfect with a test output, answers in a tool turn of the
model's own chat template with the per-demonstration results. The next turn continues the same conversation: its
prompt is the previous prompt, the ids as sampled and the tool turn, so an engine's prefix cache reuses all of it.

Turns follow the study's rules (SPEC 5): at most `checks` checks; after a check, a later turn runs while at least
`min_turn_thinking` thinking tokens fit the budget after reserving its call (an answer), the check's response and the
final turn, else the final turn comes; the final turn always ends the attempt (unless the deadline or the context
cannot hold even that); an answer whose program cannot be read counts as a check, and the model is told so; on an
infrastructure error with no grid the attempt falls back to one direct request (submission.solve).

Approximation of SPEC, said in the README: SPEC's model chooses when to call the tool; here every answer is a call.
That spends each turn's answer tokens on a grid, and needs no tool-call grammar and no tool-call special tokens
(which the answer grammar would have to admit after `</think>`).

Pure: the configuration, the turn caps under the budget, the stop rule and the tool turn's length limit (its text
is submission.prompt.check_text, or NO_CALL). submission.solve runs the turns against the engine and the sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass

from submission.grids import Grid


@dataclass(frozen=True)
class ToolAgentConfig:
    """SPEC section 5's numbers; off unless a profile turns it on."""

    enabled: bool = False  # first attempts run as the tool agent
    checks: int = 2  # check results shown to the model per attempt
    budget_single: int = 96_000  # tokens per attempt (generated + tool turns) for a task with one test input
    budget_multi: int = 64_000  # the same for a task with several test inputs
    first_thinking: int = 80_000  # the first turn's thinking cap (and at most the scheduler's first-attempt cap)
    first_thinking_multi: int = 48_000  # the same for a task with several test inputs
    later_thinking: int = 8_000  # each turn after a check, but the last
    final_thinking: int = 4_000  # the turn after the last check
    min_turn_thinking: int = 1_000  # a later turn runs only if this much thinking fits after the reserves
    failing_pairs: int = 2  # demonstrations shown with their expected and produced grids
    max_cells: int = 12  # wrong cells listed per demonstration
    test_output_max_cells: int = 225  # the program's test output is shown up to this size
    feedback_max_tokens: int = 2_500  # the tool turn's length limit

    def __post_init__(self) -> None:
        if self.checks < 1 or min(self.first_thinking, self.first_thinking_multi, self.later_thinking,
                                  self.final_thinking) < 1:
            raise ValueError("tool_agent: checks and the thinking caps must be positive")


NO_CALL = ("check_transform: no program could be read from your answer. Write the transformation as a Python "
           "function `def transform(grid):` in a python code block, then answer for the test input as before.")


def first_cap(config: ToolAgentConfig, single_input: bool, answer_reserve: int) -> int:
    """The first turn's thinking cap, within the attempt's budget less its answer."""
    budget = config.budget_single if single_input else config.budget_multi
    first = config.first_thinking if single_input else config.first_thinking_multi
    return max(1, min(first, budget - answer_reserve))


def next_turn(config: ToolAgentConfig, checks: int, used: int, single_input: bool, answer_reserve: int,
              limit: int) -> tuple[int, bool]:
    """(thinking cap, is the final turn) of the turn after `checks` checks and `used` tokens (generated and tool
    turns); `limit`: the thinking tokens a request starting now may have (the deadline-aware cap, the context).
    The attempt may still spend its budget less `used`, cut to `limit` and its answer. A later turn runs while checks
    remain and at least `min_turn_thinking` fits in that after reserving its call (`answer_reserve`), the check's
    response (`feedback_max_tokens`) and the final turn (`final_thinking` and its answer); its cap is what fits, at
    most `later_thinking`. Otherwise the final turn: `final_thinking` within `limit` whatever the budget (the budgets
    leave room for it; the caller ends the attempt when `limit` holds not one token)."""
    budget = config.budget_single if single_input else config.budget_multi
    left = min(budget - used, limit + answer_reserve)
    if checks < config.checks:
        room = left - answer_reserve - config.feedback_max_tokens - config.final_thinking - answer_reserve
        if room >= config.min_turn_thinking:
            return min(config.later_thinking, room), False
    return min(config.final_thinking, limit), True


def finished(train_perfect: bool, test_output: Grid | None) -> bool:
    """A check ends the attempt when the program reproduces every demonstration and gives a test output."""
    return train_perfect and test_output is not None


def within_tokens(texts: list[str], encode, limit: int) -> list[int]:
    """The ids (`encode(text)`) of the first of `texts` (most detailed first) within `limit` tokens, else of the last
    one cut to its first lines that fit (its closing line kept)."""
    for text in texts:
        ids = encode(text)
        if len(ids) <= limit:
            return ids
    lines = texts[-1].split("\n")
    while len(lines) > 1 and len(ids) > limit:
        lines.pop(-2)  # keep the closing instruction
        ids = encode("\n".join(lines))
    return ids
