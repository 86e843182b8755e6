"""The answer after `</think>`: one grammar for every engine, and one parser for every completion.

Phases after thinking (SPEC section 2): GRID, a well-formed grid (1..30 rows of 1..30 digits separated by spaces, all
rows the same length, each ending with a newline); CUE, the forced text that opens a code block with
`def transform(grid):`; PROGRAM, the body, free until the closing code fence; then end of turn. The grammar holds the
cue as a literal, so the engine forces it, and lets the body be anything without a code fence, up to a length, before
the fence.
Equal row lengths are not context-free in general but are here: one alternative per width (30 of them).

The tool agent's turns (submission.reasoning.tool_agent) call `check_transform`: CALL_OPEN and the same bounded body in
place of the grid. What a turn may write is its `Reply`: the first turn a call only (Algorithm 7 line 4, seed ~3443),
later turns a call or the answer (the model's first answer token decides), the final turn and every other request the
answer only. A plain-text call rather than the chat template's tool-call tokens: one grammar serves every engine and
template, and the call's program is read by the same parser as the answer's.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum

from submission.grids import MAX_SIDE, Grid, GridError, to_grid

THINK_START = "<think>"
THINK_END = "</think>"
FENCE = "```"
CALL_OPEN = "check_transform\n```python\ndef transform(grid):"  # a tool agent's call, in place of the answer
# Chat-format tokens that must never appear inside the answer (the grammar sees them as plain text).
CHAT_TOKENS = (THINK_START, THINK_END, "<|im_start|>", "<|endoftext|>")


class Reply(str, Enum):
    """What the grammar after `</think>` admits."""

    ANSWER = "answer"  # the grid and the program
    CALL = "call"  # a `check_transform` call only (the tool agent's first turn)
    EITHER = "either"  # a call or the answer (the tool agent's later turns)


def forced_end(sentence: str) -> str:
    """What every engine appends at the thinking cap; it ends exactly at `</think>` (text after it would be checked by
    vLLM's grammar and rejected)."""
    return f"\n{sentence}\n{THINK_END}"


def banned_answer_ids(tokenizer) -> list[int]:
    """Ids of CHAT_TOKENS in this tokenizer (end of turn stays allowed: the grammar admits it only at the end)."""
    vocab = tokenizer.get_vocab()
    return sorted(vocab[t] for t in CHAT_TOKENS if t in vocab and t != tokenizer.eos_token)


def _ebnf_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def answer_grammar(program_cue: str, program_max_chars: int, reply: Reply = Reply.ANSWER) -> str:
    """The EBNF (xgrammar's dialect) of everything after `</think>`: the answer, a `check_transform` call (CALL_OPEN,
    the body) or either, as `reply` says. The body's length is bounded in the grammar itself (xgrammar compiles
    bounded repetition cheaply), so every engine closes the code block at the same point."""
    widths = " | ".join(f"grid{w}" for w in range(1, MAX_SIDE + 1))
    answer = f"({widths}) cue body"
    root = {Reply.ANSWER: answer, Reply.CALL: "call body", Reply.EITHER: f"({answer} | call body)"}[reply]
    rules = [
        f"root ::= lead {root}",
        'lead ::= "\\n"{0,2}',
        f"cue ::= {_ebnf_string(program_cue)}",
        # the body: any text without three backticks in a row, then the closing fence
        f'body ::= ([^`] | "`" [^`] | "``" [^`]){{0,{program_max_chars}}} "```"',
        "d ::= [0-9]",
    ]
    for w in range(1, MAX_SIDE + 1):
        row = "d" + ' " " d' * (w - 1) + ' "\\n"'
        rules.append(f"grid{w} ::= row{w}{{1,{MAX_SIDE}}}")
        rules.append(f"row{w} ::= {row}")
    if reply is not Reply.ANSWER:
        rules.append(f"call ::= {_ebnf_string(CALL_OPEN)}")
    return "\n".join(rules) + "\n"


@dataclass(frozen=True)
class ParsedAnswer:
    grid: Grid | None
    program: str | None  # a full `def transform(grid):` source, or None
    error: str | None  # why there is no grid
    call: bool = False  # a `check_transform` call (CALL_OPEN) rather than an answer
    closed: bool = False  # the program's code block was closed (a call cut by the answer limit is not)


_ROW = re.compile(r"^[0-9]( [0-9])*$")


def parse_answer(completion: str) -> ParsedAnswer:
    """The grid and the program from a completion (thinking included or not): text after the last `</think>`."""
    answer = completion.rsplit(THINK_END, 1)[1] if THINK_END in completion else completion
    if THINK_END in completion and answer.lstrip("\n").startswith(CALL_OPEN):
        start = answer.find("def transform(grid):")
        end = answer.find(FENCE, start)
        return ParsedAnswer(None, answer[start:end if end >= 0 else None].rstrip() + "\n",
                            "a check_transform call, not an answer", call=True, closed=end >= 0)
    lines = answer.lstrip("\n").split("\n")
    rows = []
    for line in lines:
        if not _ROW.match(line):
            break
        rows.append([int(c) for c in line.split(" ")])
    grid, error = None, None
    if not rows:
        error = "no grid rows after </think>"
    else:
        try:
            grid = to_grid(rows)
        except GridError as err:
            error = f"grid: {err}"
    program = None
    start = answer.find("def transform(grid):")
    if start >= 0:
        end = answer.find(FENCE, start)
        program = answer[start:end if end >= 0 else None].rstrip() + "\n"
        return ParsedAnswer(grid, program, error, closed=end >= 0)
    return ParsedAnswer(grid, program, error)
