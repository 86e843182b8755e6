"""The grid line's 16-token format: what a task looks like to the grid model, and the grammar of an answer.

Tokens (id = index): the ten colours "0".."9", newline, the role markers "I" (an input grid follows) and "O" (an
output grid follows), padding, end of sequence, begin of sequence. A grid is its rows, each ended by a newline. A
sequence is <bos>, then per demonstration `I grid O grid <eos>`, then the query `I grid O`; the model answers with
the output grid's rows and <eos>. Training puts the loss on every output grid and its <eos> (`output_mask`).

Demonstrations that do not fit the context are cut from the front (the first shown are dropped first), so the
query and the last demonstrations always fit; a query that alone does not fit is an error for the caller.
"""

from __future__ import annotations

from dataclasses import dataclass

from submission.grids import COLOURS, MAX_SIDE, Grid
from submission.tasks import Pair

TOKENS = ("0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "\n", "I", "O", "<pad>", "<eos>", "<bos>")
NEWLINE, INPUT, OUTPUT, PAD, EOS, BOS = range(COLOURS, COLOURS + 6)
VOCAB = len(TOKENS)


def grid_ids(grid: Grid) -> list[int]:
    return [cell for row in grid for cell in (*row, NEWLINE)]


def pair_ids(pair: Pair) -> tuple[list[int], list[bool]]:
    """`I input O output <eos>` and its loss mask (True on the output grid and its <eos>)."""
    head = [INPUT, *grid_ids(pair.input), OUTPUT]
    tail = [*grid_ids(pair.output), EOS]
    return head + tail, [False] * len(head) + [True] * len(tail)


def query_ids(test_input: Grid) -> list[int]:
    return [INPUT, *grid_ids(test_input), OUTPUT]


@dataclass(frozen=True)
class Encoded:
    ids: tuple[int, ...]
    output_mask: tuple[bool, ...]  # where training puts its loss
    shown: int  # demonstrations kept (the last `shown` of those given)


def encode(demonstrations: tuple[Pair, ...], query: Grid | None = None, answer: Grid | None = None,
           max_len: int = 8192) -> Encoded:
    """<bos>, the demonstrations that fit (cut from the front), then the query (and its answer, for training and
    rescoring). Raises ValueError if the query (with its answer) alone exceeds max_len."""
    tail: list[int] = []
    tail_mask: list[bool] = []
    if query is not None:
        tail = query_ids(query)
        tail_mask = [False] * len(tail)
        if answer is not None:
            out = [*grid_ids(answer), EOS]
            tail += out
            tail_mask += [True] * len(out)
    if 1 + len(tail) > max_len:
        raise ValueError(f"the query takes {1 + len(tail)} tokens, more than the context of {max_len}")
    parts = [pair_ids(p) for p in demonstrations]
    used = 1 + len(tail)
    kept = 0
    for ids, _ in reversed(parts):
        if used + len(ids) > max_len:
            break
        used += len(ids)
        kept += 1
    ids, mask = [BOS], [False]
    for pair, pair_mask in parts[len(parts) - kept:]:
        ids += pair
        mask += pair_mask
    return Encoded(tuple(ids + tail), tuple(mask + tail_mask), kept)


class FormatError(ValueError):
    """Token ids that are not a well-formed answer; the message says where."""


def decode_grid(ids: list[int] | tuple[int, ...]) -> Grid:
    """The grid of an answer (rows ended by newlines, then <eos>, which may be absent); the exact inverse of
    `grid_ids` (+ <eos>)."""
    ids = list(ids)
    if ids and ids[-1] == EOS:
        ids.pop()
    rows: list[tuple[int, ...]] = []
    row: list[int] = []
    for position, token in enumerate(ids):
        if token == NEWLINE:
            if not row or (rows and len(row) != len(rows[0])):
                raise FormatError(f"token {position}: row {len(rows)} has {len(row)} cells")
            rows.append(tuple(row))
            row = []
        elif 0 <= token < COLOURS:
            row.append(token)
        else:
            raise FormatError(f"token {position}: {TOKENS[token] if 0 <= token < VOCAB else token!r} inside a grid")
    if row or not rows:
        raise FormatError("the grid does not end with a complete row")
    if len(rows) > MAX_SIDE or len(rows[0]) > MAX_SIDE:
        raise FormatError(f"grid of {len(rows)}x{len(rows[0])} exceeds {MAX_SIDE}x{MAX_SIDE}")
    return tuple(rows)


def decode_sequence(ids: list[int] | tuple[int, ...]) -> list[tuple[Grid, Grid | None]]:
    """The (input, output) pairs of an encoded sequence, the query's output None if it has no answer yet: the
    inverse of `encode` (used by the round-trip tests and to read sequences back when debugging)."""
    ids = list(ids)
    if not ids or ids[0] != BOS:
        raise FormatError("a sequence starts with <bos>")
    pairs: list[tuple[Grid, Grid | None]] = []
    position = 1
    while position < len(ids):
        if ids[position] != INPUT:
            raise FormatError(f"token {position}: expected 'I'")
        end = ids.index(OUTPUT, position)
        grid_in = decode_grid(ids[position + 1:end])
        stop = ids.index(EOS, end) if EOS in ids[end:] else len(ids)
        pairs.append((grid_in, decode_grid(ids[end + 1:stop]) if stop > end + 1 else None))
        position = stop + 1
    return pairs


@dataclass(frozen=True)
class GridState:
    """Where an answer being written stands: cells in the current row, the width fixed by the first row (0 before
    it ends), rows finished. The grammar of SPEC section 10's search: rectangular rows, 1..max_side each way."""

    in_row: int = 0
    width: int = 0
    rows: int = 0
    done: bool = False

    def legal(self, max_side: int = MAX_SIDE) -> tuple[int, ...]:
        if self.done:
            return ()
        out: list[int] = []
        limit = self.width or max_side
        if self.in_row < limit and self.rows < max_side:
            out += range(COLOURS)
        if self.in_row > 0 and (self.width == 0 or self.in_row == self.width):
            out.append(NEWLINE)
        if self.in_row == 0 and self.rows > 0:
            out.append(EOS)
        return tuple(out)

    def advance(self, token: int) -> GridState:
        if token == EOS:
            return GridState(0, self.width, self.rows, True)
        if token == NEWLINE:
            return GridState(0, self.width or self.in_row, self.rows + 1)
        return GridState(self.in_row + 1, self.width, self.rows)
