"""What a tool agent's turns take besides thinking, measured on real tasks, and how often a budget leaves no room for
a second check.

    python -m sim.agent_turns [--tasks ARC_DATA/arc-agi-2/evaluation] [--log sim/data/example_attempts.jsonl]

Algorithm 7 (seed ~3441-3442) runs another turn while the budget leaves at least 1,000 thinking tokens after
reserving the call, the tool response and the final turn. The kit's reserves
(submission.reasoning.tool_agent.ToolAgentConfig: `call_reserve`, `feedback_reserve`, `answer_reserve`) are the medians
of what those take here, on every test input of the given tasks (`measure`), rounded up to a hundred tokens: what a turn
usually takes, as the study's caps assume (59K + 8K + 4K thinking of a 75K budget leave 4K for two calls, two responses
and the answer; the medians take 2.6K). A turn that takes more shortens the final turn's thinking, down to closing at
once (submission.reasoning.tool_agent.next_turn). The ones measured here:
- the call: `check_transform`, a code block and the program, then the end of turn;
- the tool response: submission.reasoning.prompt.check_text for a program that fails (its output on each demonstration
  is the demonstration's input, a plausible wrong program's), with its two failing pairs' grids, or without them, or
  cut, to fit `feedback_max_tokens`, as the solver writes it (submission.reasoning.tool_agent.within_tokens);
- the final answer: the grid (the task's label) in rows, the program cue, the program and the fence.
The programs are the 16 hand-written ones in examples/programs (a model's programs are likely longer, and a longer
program makes the call and the answer longer alike). Tokens are counted as Qwen's tokenizer splits text before its
merges (`pretokens`): exact for grids (a digit, a space and a newline are one token each), a lower bound for code,
whose rare identifiers BPE may split further. Approximate, as the README says.

`preview` replays first turns against a budget, each as the solver would go on after it
(submission.reasoning.tool_agent.next_turn, with the context limit of `request_limit`; no deadline): the attempts
whose first turn, with its call and tool response, leaves no room for a second check. No model runs here, so the first
turns' thinking comes from an attempt log (the shipped example is synthetic: sim/example_log.py; its lengths are a
parameterised guess, not the study's agent's), one logged first attempt per test input of the tasks, cut at its own
first turn's cap (single-input or multi-input), with the call and the response measured on that input for a program
drawn for it, and the prompt (the task's text and the tool's description, in pre-tokens) against the context.

The study's 172-input preview of the 96K / 80K (64K / 48K) configuration had 7 attempts without room for a second
check (seed ~3377-3380: 87 accepted at the first check, 25 at the second, 53 used both, 7 no room: 87 + 2 x 25 +
2 x 53 + 7 = the 250 checks it counts, so the 7 made one check each). It is not reproduced here, and cannot be from
the study's numbers:
- The study gives no first-turn lengths of that preview (no distribution, no share at the cap), no size for the call
  or the final answer it reserved (only the response's 2,500-token limit, ~3450, and the final turn's 4K thinking,
  ~3435), and no deadline for it; and its 172 inputs are not the kit's copy of ARC-AGI-2 evaluation (167 test inputs).
- What the study's numbers do fix (`spare_at_cap`): each of its configurations leaves B - c1 = 16,000 tokens after a
  first turn at its cap (96K - 80K, 64K - 48K, 75K - 59K). Less the final turn's 4,000, the 1,000 a second turn must
  keep and two responses at their 2,500 limit, 6,000 are left for the first call and the call and answer reserves
  together. So by its budget alone an attempt had no room only if those took more than 6,000 tokens: the preview's
  reserves for a call and an answer were far above what those usually take (the medians below: ~100 and ~800), for
  instance an answer reserved at its limit, in which case a first turn that ran to its cap had no room and the 7 are
  the ones of those not accepted at their first check (4% of the inputs), or its deadline cut the budget (the 54.44
  run's caps cut the agent's, ~4499-4500).
- The kit's reserves are the medians, as the issue asked (what the turns really take): 100 + 800 + 800 leave room for
  a second check after any first turn by the budget alone, even at its cap with a call of `answer_max_tokens` and a
  response at its limit, and the context of moe-4xL4 (114,688) leaves it for every ARC-AGI-2 evaluation prompt (at
  most ~16.4K pre-tokens; after an 80K first turn with such a call and response it would take ~18.3K to lose it).
  So the kit's replay gives 0 of any log on these tasks, and only the deadline takes the second check away (the cap
  formula at 8 tokens/s, for a first check that ends within ~23 minutes of the hard stop).
`preview` also replays the reserves at their limits (the kit's arithmetic before: answer_max_tokens for the call and
the answer, the response limit): then, as under the first reading of the study's 7, no room means a first turn at
its cap, which the synthetic log has far more often than the study's 7 of 172 would allow (on the example log, 53 of
167: 19 of its 75 single-input first attempts reach 80K, 48 of its 92 multi-input ones 48K).
"""

from __future__ import annotations

import argparse
import dataclasses
import math
import os
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from submission.reasoning.reply_grammar import CALL_OPEN, FENCE
from submission.attempts import read_log
from submission.profiles import load
from submission.reasoning.profile import EngineConfig, PromptConfig
from submission.reasoning.prompt import check_text, grid_text, task_text
from submission.schedule import Level
from submission.tasks import Task, load_tasks
from submission.reasoning.tool_agent import (ToolAgentConfig, first_cap, instructions, next_turn, request_limit,
                                             within_tokens)

ROOT = Path(__file__).resolve().parents[1]
PROGRAMS = ROOT / "examples" / "programs"
# Qwen2/3's pre-tokenizer pattern with Python's re: \p{L} as [^\W\d_], \p{N} as \d ("_" is punctuation there).
QWEN_SPLIT = re.compile(r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|(?:[^\r\n\w]|_)?[^\W\d_]+|\d| ?(?:[^\s\w]|_)+[\r\n]*"
                        r"|\s*[\r\n]+|\s+(?!\S)|\s+")
END_OF_TURN = 1  # the end-of-turn token after a call or an answer


def pretokens(text: str) -> int:
    """Qwen's pre-tokens in `text`: its tokens for grids, a lower bound for other text (module doc)."""
    return len(QWEN_SPLIT.findall(text))


@dataclass(frozen=True)
class TurnSizes:
    call: int  # the call after the thinking
    response: int  # the tool turn's text
    answer: int  # the final turn's grid, cue and program


def sizes(task: Task, test_index: int, program: str, config: ToolAgentConfig, cue: str) -> TurnSizes:
    body = program.split("def transform(grid):", 1)[-1]
    demos = [(pair.output, pair.input, "wrong") for pair in task.train]
    test = task.test_inputs[test_index]
    texts = [check_text(demos, test, "ok", config.failing_pairs, config.max_cells, config.test_output_max_cells,
                        grids) for grids in (True, False)]
    response = len(within_tokens(texts, lambda text: [0] * pretokens(text), config.feedback_max_tokens))
    answer = task.test_outputs[test_index] if task.test_outputs else test
    return TurnSizes(pretokens(CALL_OPEN + body + FENCE) + END_OF_TURN, response,
                     pretokens(grid_text(answer) + "\n" + cue + body + FENCE) + END_OF_TURN)


def measure(tasks: list[Task], programs: list[str], config: ToolAgentConfig, cue: str) -> list[TurnSizes]:
    """Every (test input, program) pair's sizes."""
    return [sizes(task, index, program, config, cue) for task in tasks for index in range(len(task.test_inputs))
            for program in programs]


def percentile(values: list[int], q: float) -> int:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, math.ceil(q * len(ordered)) - 1)]


def reserves(measured: list[TurnSizes], q: float = 0.5) -> tuple[int, int, int]:
    """(call, response, answer) at the q-th quantile, rounded up to a hundred tokens."""
    up = lambda n: -(-n // 100) * 100  # noqa: E731
    return tuple(up(percentile([getattr(s, f) for s in measured], q)) for f in ("call", "response", "answer"))


@dataclass(frozen=True)
class FirstTurn:
    single: bool  # the task has one test input: the single-input budget and cap
    prompt: int  # the first turn's prompt: the task's text and the tool's description (pre-tokens)
    thinking: int  # the logged first attempt's thinking tokens (cut to the first turn's cap when replayed)
    sizes: TurnSizes  # the call and the tool response after it (and the final answer), measured on this input


def no_room(config: ToolAgentConfig, engine: EngineConfig, turn: FirstTurn) -> bool:
    """Whether the first turn, its call and its tool response leave no room for a second check: the solver's own rule
    (next_turn, with the context limit of request_limit), no deadline."""
    used = min(turn.thinking, first_cap(config, turn.single)) + turn.sizes.call + turn.sizes.response
    limit = request_limit(10 ** 9, engine.max_model_len, turn.prompt + used, engine.answer_max_tokens)
    return next_turn(config, 1, used, turn.single, limit)[1]


def preview(config: ToolAgentConfig, engine: EngineConfig, firsts: list[FirstTurn]) -> int:
    """How many of the first turns leave no room for a second check."""
    return sum(no_room(config, engine, turn) for turn in firsts)


def spare_at_cap(config: ToolAgentConfig, single: bool) -> int:
    """From the study's own numbers (module doc): what the first call and the reserves for the second call and the
    answer may take together, with both tool responses at their limit, before a first turn at its cap has no room
    for a second check by the budget alone."""
    budget = config.budget_single if single else config.budget_multi
    return (budget - first_cap(dataclasses.replace(config, call_reserve=0), single) - config.final_thinking
            - config.min_turn_thinking - 2 * config.feedback_max_tokens)


def first_turns(log: Path, tasks: list[Task], programs: list[str], config: ToolAgentConfig, prompt: PromptConfig,
                cue: str, seed: int = 0) -> list[FirstTurn]:
    """One first turn per test input of `tasks` that the log holds a finished first attempt for, with the sizes
    measured on that input for a program drawn (seeded) for it."""
    logged = {(r.task_id, r.test_index): r.thinking_tokens for r in read_log(log)
              if r.level is Level.FIRST and not r.aborted}
    rng = random.Random(seed)
    tool = instructions(config.checks)
    return [FirstTurn(len(task.test_inputs) == 1, pretokens(task_text(task, i, prompt) + tool), logged[key],
                      sizes(task, i, rng.choice(programs), config, cue))
            for task in tasks for i in range(len(task.test_inputs)) if (key := (task.id, i)) in logged]


PREVIEW = ToolAgentConfig(enabled=True, budget_single=96_000, first_thinking=80_000)  # Algorithm 7's configuration
STUDY_75K = ToolAgentConfig(enabled=True, budget_single=75_000, first_thinking=59_000)  # the 56.67 run (seed ~3430)
KIT_BEFORE = dict(call_reserve=4_000, feedback_reserve=2_500, answer_reserve=4_000)  # answer_max_tokens, 2.5K, 4K
PROFILE = "moe-4xL4"  # the engine (context, answer limit) and prompt the agent runs with


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sim.agent_turns", description=__doc__.splitlines()[0])
    data = Path(os.environ.get("ARC_DATA", ROOT.parent / "shared" / "arc-data"))
    parser.add_argument("--tasks", type=Path, default=data / "arc-agi-2" / "evaluation")
    parser.add_argument("--log", type=Path, default=ROOT / "sim" / "data" / "example_attempts.jsonl")
    args = parser.parse_args(argv)
    tasks = load_tasks(args.tasks).tasks
    programs = [p.read_text() for p in sorted(PROGRAMS.glob("*.py"))]
    measured = measure(tasks, programs, ToolAgentConfig(), EngineConfig().program_cue)
    print(f"{len(measured)} (test input, program) pairs of {len(tasks)} tasks x {len(programs)} programs")
    for name in ("call", "response", "answer"):
        values = [getattr(s, name) for s in measured]
        print(f"  {name:8} median {percentile(values, 0.5):5}  90th {percentile(values, 0.9):5}  max {max(values):5}")
    print(f"reserves (medians, rounded up): call, response, answer = {reserves(measured)}; "
          f"shipped: {ToolAgentConfig().call_reserve}, {ToolAgentConfig().feedback_reserve}, "
          f"{ToolAgentConfig().answer_reserve}")
    profile = load(PROFILE)
    firsts = first_turns(args.log, tasks, programs, ToolAgentConfig(), profile.prompt, EngineConfig().program_cue)
    print(f"{len(firsts)} first turns of {os.path.relpath(args.log)} (one per test input; {sum(t.single for t in firsts)} of "
          f"single-input tasks); prompts up to {max(t.prompt for t in firsts)} pre-tokens, "
          f"context {profile.engine.max_model_len}")
    for label, config in (("96K / 80K (the preview)", PREVIEW), ("75K / 59K (56.67)", STUDY_75K)):
        print(f"{label}: the study's numbers leave {spare_at_cap(config, True)} (single) / "
              f"{spare_at_cap(config, False)} (multi) for the first call and the call and answer reserves")
        for reserve, changes in (("measured", {}), ("at their limits (before)", KIT_BEFORE)):
            config_ = ToolAgentConfig(**{**config.__dict__, **changes})
            print(f"  reserves {reserve}: {preview(config_, profile.engine, firsts)} of {len(firsts)} first turns "
                  "leave no room for a second check (the study's preview: 7 of 172)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
