"""The answer after `</think>`: one grammar for every engine, and one parser for every completion.

Phases after thinking (SPEC section 2): GRID, a well-formed grid (1..30 rows of 1..30 digits separated by spaces, all
rows the same length, each ending with a newline); CUE, the forced text that opens a code block with
`def transform(grid):`; PROGRAM, the body, free until the closing code fence; then end of turn. The grammar holds the
cue as a literal, so the engine forces it, and lets the body be anything without a code fence before the fence.
Equal row lengths are not context-free in general but are here: one alternative per width (30 of them).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from submission.grids import MAX_SIDE, Grid, GridError, to_grid

THINK_END = "</think>"
FENCE = "```"


def _ebnf_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def answer_grammar(program_cue: str) -> str:
    """The EBNF (xgrammar's dialect, also GBNF) of everything after `</think>`."""
    widths = " | ".join(f"grid{w}" for w in range(1, MAX_SIDE + 1))
    rules = [
        f"root ::= lead ({widths}) cue body",
        'lead ::= "\\n"{0,2}',
        f"cue ::= {_ebnf_string(program_cue)}",
        # the body: any text without three backticks in a row, then the closing fence
        'body ::= ([^`] | "`" [^`] | "``" [^`])* "```"',
        "d ::= [0-9]",
    ]
    for w in range(1, MAX_SIDE + 1):
        row = "d" + ' " " d' * (w - 1) + ' "\\n"'
        rules.append(f"grid{w} ::= row{w}{{1,{MAX_SIDE}}}")
        rules.append(f"row{w} ::= {row}")
    return "\n".join(rules) + "\n"


@dataclass(frozen=True)
class ParsedAnswer:
    grid: Grid | None
    program: str | None  # a full `def transform(grid):` source, or None
    error: str | None  # why there is no grid


_ROW = re.compile(r"^[0-9]( [0-9])*$")


def parse_answer(completion: str) -> ParsedAnswer:
    """The grid and the program from a completion (thinking included or not): text after the last `</think>`."""
    answer = completion.rsplit(THINK_END, 1)[1] if THINK_END in completion else completion
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
    return ParsedAnswer(grid, program, error)
