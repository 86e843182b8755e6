"""The tool agent (SPEC section 5, Algorithm 7 of the study, seed ~3424-3471): a first attempt whose model checks
programs on the demonstrations before it answers.

Every turn is one ordinary request: thinking up to the turn's cap (the forced close at the cap), then what the turn's
grammar admits (submission.reasoning.reply_grammar, `Reply`): the first turn a `check_transform` call (CALL_OPEN and a
program) only, as Algorithm 7 line 4 has it ("emit a check_transform call; from the second turn on, the final grid and
program are also allowed"); later turns a call or the answer (grid and `transform` program, which ends the attempt), the
model's choice; the final turn the answer. An engine that ignores the grammar (a replayed or scripted completion) and
answers on the first turn has its answer read as the call (submission.reasoning.solve.as_call): not accepted, since the
study accepts the final grid only from the second turn on, and not wasted, since its program is checked and shown as a
call's. The prompt says so (`instructions`). The kit runs a call's program on the demonstrations and answers in a tool
turn of the model's own chat template with the per-demonstration results; the next turn continues the same conversation:
its prompt is the previous prompt, the ids as sampled and the tool turn, so an engine's prefix cache reuses all of it.

Turns follow the study's rules (SPEC 5): at most `checks` checks; after a check, a later turn runs while at least
`min_turn_thinking` thinking tokens fit the budget after reserving its call, the check's response and the final turn
(the reserves: what those take, measured by sim.agent_turns), else the final turn comes; after the last check, or a
check that finds the program train-perfect with a test output, the final turn comes too. The final turn admits no
call and always ends the attempt: it thinks what is left of `final_thinking` after its answer, or closes at once
when nothing is left (unless the deadline or the context cannot hold a request at all); a call whose program cannot be
read (no grid and no closed call: cut by the answer limit, or thinking ended by end of turn) counts as a check, the
model is told so and the loop goes on. The result (Algorithm 7 lines 16-17, submission.reasoning.solve.agent_result and
needs_direct): every checked program found train-perfect, in check order, then the final program if it passes, is a
program candidate; every other program that ran with a test output joins the weak pool (submission.selection); only an
infrastructure error that left neither a grid nor a checked program runs the direct attempt instead.

Approximation of SPEC, said in the README: the call is plain text under the grammar, not the chat template's
tool-call tokens, and the tool is described in the user message, not in the template's tool list; the study's
exact call format and tool description are not known.

Pure: the configuration, the prompt's tool description, the turn caps under the budget, the stop rule and the tool
turn's length limit (its text is submission.reasoning.prompt.check_text, or NO_CALL). submission.reasoning.solve runs
the turns against the engine and the sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass

from submission.reasoning.reply_grammar import CALL_OPEN, FENCE
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
    # What a turn takes besides its thinking, reserved before another turn (Algorithm 7 line 3): its call, the tool's
    # response and the final turn's answer (grid, cue, program): the medians measured by sim.agent_turns on ARC-AGI-2
    # evaluation (approximate token counts: its doc; benchmarks/RESULTS.md); the limits stay answer_max_tokens and
    # feedback_max_tokens.
    call_reserve: int = 100
    feedback_reserve: int = 800
    answer_reserve: int = 800
    failing_pairs: int = 2  # demonstrations shown with their expected and produced grids
    max_cells: int = 12  # wrong cells listed per demonstration
    test_output_max_cells: int = 225  # the program's test output is shown up to this size
    feedback_max_tokens: int = 2_500  # the tool turn's length limit

    def __post_init__(self) -> None:
        if self.checks < 1 or min(self.first_thinking, self.first_thinking_multi, self.later_thinking,
                                  self.final_thinking) < 1:
            raise ValueError("tool_agent: checks and the thinking caps must be positive")
        if min(self.call_reserve, self.feedback_reserve, self.answer_reserve) < 0:
            raise ValueError("tool_agent: the reserves must not be negative")


NO_CALL = ("check_transform: no program could be read from your call. Write the transformation as a Python "
           "function `def transform(grid):` in a python code block, then answer for the test input as before.")
LAST_CHECK = "No checks are left: answer for the test input now, the output grid and then the program."


def instructions(checks: int) -> str:
    """The tool's description, appended to the first turn's user message (the direct fallback's prompt has none).
    The first turn must check (Algorithm 7 line 4; its grammar admits only the call), so the text says so."""
    return (f"\n\nCheck a program on the examples before you answer, at most {checks} times: after thinking, "
            f"write\n{CALL_OPEN}\n    ...\n{FENCE}\nand you will see its result on every example and its output "
            "for the test input. Your first reply must be such a check. After it, answer when you are sure: the "
            "output grid, then the program.")


def first_cap(config: ToolAgentConfig, single_input: bool) -> int:
    """The first turn's thinking cap, within the attempt's budget less its call."""
    budget = config.budget_single if single_input else config.budget_multi
    first = config.first_thinking if single_input else config.first_thinking_multi
    return max(1, min(first, budget - config.call_reserve))


def next_turn(config: ToolAgentConfig, checks: int, used: int, single_input: bool, limit: int,
              verified: bool = False) -> tuple[int, bool]:
    """(thinking cap, is the final turn) of the turn after `checks` checks and `used` tokens (generated and tool
    turns); `limit`: the thinking tokens a request starting now may have (the deadline-aware cap, the context);
    `verified`: the last check found the program train-perfect with a test output (the final turn comes).
    The attempt may still spend its budget less `used`, cut to `limit` and an answer. A later turn runs while checks
    remain and at least `min_turn_thinking` fits after reserving its call (`call_reserve`), the tool's response
    (`feedback_reserve`) and the final turn (`final_thinking` and `answer_reserve`): Algorithm 7 line 3 (seed
    ~3441-3442); its cap is what fits, at most `later_thinking`. Otherwise the final turn: `final_thinking` within
    what is left after its answer and within `limit`; 0 when nothing is left: it closes at once and answers (line 14,
    seed ~3462). The caller ends the attempt instead when `limit` holds not one token (the deadline, the context)."""
    budget = config.budget_single if single_input else config.budget_multi
    left = min(budget - used, limit + config.answer_reserve)  # a request's answer comes on top of its thinking cap
    if checks < config.checks and not verified:
        room = left - config.call_reserve - config.feedback_reserve - config.final_thinking - config.answer_reserve
        if room >= config.min_turn_thinking:
            return min(config.later_thinking, room), False
    return max(0, min(config.final_thinking, left - config.answer_reserve)), True


def request_limit(deadline_cap: int, max_model_len: int, context: int, answer_max_tokens: int) -> int:
    """The thinking tokens the next turn's request may have (`next_turn`'s `limit`): the deadline-aware cap, and what
    the model's length (`max_model_len`; 0: unbounded) leaves after the conversation so far (`context` tokens: the
    prompt, every turn and tool turn) and an answer of `answer_max_tokens`."""
    return min(deadline_cap, max_model_len - context - answer_max_tokens) if max_model_len else deadline_cap


def finished(train_perfect: bool, test_output: Grid | None) -> bool:
    """After a check whose program reproduces every demonstration and gives a test output, the final turn comes."""
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
