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

`preview` replays first turns against a budget: the attempts whose first turn, with its call and tool response,
leaves no room for a second check (submission.reasoning.tool_agent.next_turn). The study's 172-input preview of the 96K
/ 80K / 8K / 4K configuration had 7 such attempts (seed ~3377-3380). No model runs here, so the first turns' thinking
comes from an attempt log (the shipped example is synthetic: sim/example_log.py) cut at the first turn's cap, with the
measured call and response of a task drawn for each.
"""

from __future__ import annotations

import argparse
import math
import os
import random
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from submission.reasoning.reply_grammar import CALL_OPEN, FENCE
from submission.attempts import read_log
from submission.reasoning.profile import EngineConfig
from submission.reasoning.prompt import check_text, grid_text
from submission.schedule import Level
from submission.tasks import Task, load_tasks
from submission.reasoning.tool_agent import ToolAgentConfig, first_cap, next_turn, within_tokens

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


def no_room(config: ToolAgentConfig, first_thinking: int, turn: TurnSizes, single: bool = True) -> bool:
    """Whether a first turn of `first_thinking` tokens, its call and its tool response leave no room for a second
    check (no deadline: the budget alone)."""
    used = first_thinking + turn.call + turn.response
    return next_turn(config, 1, used, single, 10 ** 9)[1]


def preview(config: ToolAgentConfig, firsts: list[int], measured: list[TurnSizes], seed: int = 0) -> int:
    """How many of the first turns (thinking tokens, cut to the first turn's cap) leave no room for a second check,
    each with the sizes of a measured turn drawn at random."""
    rng = random.Random(seed)
    cap = first_cap(config, True)
    return sum(no_room(config, min(t, cap), rng.choice(measured)) for t in firsts)


def first_turns(log: Path, count: int, seed: int = 0) -> list[int]:
    """`count` first attempts' thinking tokens of a log, drawn at random (with replacement)."""
    thinking = [r.thinking_tokens for r in read_log(log) if r.level is Level.FIRST and not r.aborted]
    return random.Random(seed).choices(thinking, k=count)


PREVIEW = ToolAgentConfig(enabled=True, budget_single=96_000, first_thinking=80_000)  # Algorithm 7's configuration
STUDY_75K = ToolAgentConfig(enabled=True, budget_single=75_000, first_thinking=59_000)  # the 56.67 run (seed ~3430)
KIT_BEFORE = dict(call_reserve=4_000, feedback_reserve=2_500, answer_reserve=4_000)  # answer_max_tokens, 2.5K, 4K


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
    firsts = first_turns(args.log, 172)
    for label, config in (("96K / 80K (the preview)", PREVIEW), ("75K / 59K (56.67)", STUDY_75K)):
        for reserve, changes in (("measured", {}), ("before (answer_max_tokens 4,000)", KIT_BEFORE)):
            config_ = ToolAgentConfig(**{**config.__dict__, **changes})
            print(f"{label}, reserves {reserve}: {preview(config_, firsts, measured)} of 172 first turns leave no room "
                  "for a second check (the study's preview: 7)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
