"""The grid line's formats: what a task looks like to the grid model, and the grammar of an answer.

A format is data, not code. `LAYOUTS` holds each as text, the profile's `model.format` names one, and the token ids
come from the checkpoint's own tokenizer files (`read_format`), checked before any weight is loaded: every grid
symbol and marker one id of its own, inside the model's vocabulary, or an error naming the token.

- `kit16` (build.models.grid_vocab's cut): <bos>, then per demonstration `I grid O grid <eos>`, then the query
  `I grid O`; every row ends with a newline, the last one included.
- `nvarc` (NVARC's published Qwen3 4B, github 1ytic/NVARC: `QwenFormatter` in ARC-AGI1/002_ivan_arc1.ipynb, the
  16-token tokenizer in ARChitects/qwen3_configs/): no begin token; per demonstration
  `<|im_start|>user\\n grid <|im_end|><|im_start|>assistant\\n grid <|im_end|>`, then the query up to
  `assistant\\n`; rows are joined by newlines (`convert_grid_to_string(...).strip()`: no newline after the last).

The model answers with the output grid and the end token; training puts the loss on every output grid and its end
token (`output_mask`, NVARC's collator's span). Demonstrations that do not fit the context are cut from the front
(the first shown are dropped first), so the query and the last demonstrations always fit; a query that alone does
not fit is an error for the caller.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from submission.grids import COLOURS, MAX_SIDE, Grid
from submission.tasks import Pair

TOKENS = ("0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "\n", "I", "O", "<pad>", "<eos>", "<bos>")
NEWLINE, INPUT, OUTPUT, PAD, EOS, BOS = range(COLOURS, COLOURS + 6)
VOCAB = len(TOKENS)  # kit16's, the vocabulary build.models.grid_vocab cuts to


@dataclass(frozen=True)
class Layout:
    """A format as text: the tokens' strings, resolved to ids by a checkpoint's tokenizer."""

    start: tuple[str, ...]  # before the first demonstration
    input_head: tuple[str, ...]  # before an input grid
    output_head: tuple[str, ...]  # between an input grid and its output grid
    end: str  # after an output grid: the model's end of answer
    pad: str
    last_newline: bool  # the last row ends with a newline too
    colours: tuple[str, ...] = tuple(TOKENS[:COLOURS])
    newline: str = "\n"


LAYOUTS = {
    "kit16": Layout(("<bos>",), ("I",), ("O",), "<eos>", "<pad>", True),
    "nvarc": Layout((), ("<|im_start|>", "user", "\n"), ("<|im_end|>", "<|im_start|>", "assistant", "\n"),
                    "<|im_end|>", "<|endoftext|>", False),
}


@dataclass(frozen=True)
class GridFormat:
    """A layout with a checkpoint's token ids (`resolve`); every function below that builds or reads ids takes one."""

    name: str
    colours: tuple[int, ...]  # the id of colour c at index c
    newline: int
    start: tuple[int, ...]
    input_head: tuple[int, ...]
    output_head: tuple[int, ...]
    eos: int
    pad: int
    last_newline: bool
    layout: Layout  # the strings, for messages

    @property
    def colour_of(self) -> dict[int, int]:
        return {token: colour for colour, token in enumerate(self.colours)}

    def text(self, token: int) -> str:
        """A token's string in this format (for messages), or its id if the format does not use it."""
        layout = self.layout
        pairs = [*zip(self.colours, layout.colours), (self.newline, layout.newline), (self.eos, layout.end),
                 (self.pad, layout.pad), *zip(self.start, layout.start), *zip(self.input_head, layout.input_head),
                 *zip(self.output_head, layout.output_head)]
        return next((repr(text) for id_, text in pairs if id_ == token), str(token))


class FormatError(ValueError):
    """Token ids that are not a well-formed answer, or a tokenizer that lacks a format's token; the message says
    where."""


def resolve(name: str, ids_of: dict[str, list[int]], vocab_size: int, where: str) -> GridFormat:
    """The format `name` with the ids a tokenizer gives each of its strings (`ids_of`: string -> the ids it encodes
    to, only those that decode back to it); FormatError naming `where` and the first token that is not one id of its
    own below vocab_size."""
    if name not in LAYOUTS:
        raise FormatError(f"{where}: unknown grid format {name!r}; one of {', '.join(LAYOUTS)}")
    layout = LAYOUTS[name]

    def one(text: str) -> int:
        found = ids_of.get(text, [])
        if len(found) != 1:
            raise FormatError(f"{where}: format {name!r} needs the token {text!r} as one id; the tokenizer gives "
                              f"{found}")
        if not 0 <= found[0] < vocab_size:
            raise FormatError(f"{where}: format {name!r}: token {text!r} is id {found[0]}, outside the model's "
                              f"vocab_size {vocab_size}")
        return found[0]

    symbols = [*layout.colours, layout.newline, layout.end]
    grid = {text: one(text) for text in symbols}
    if len(set(grid.values())) != len(symbols):
        raise FormatError(f"{where}: format {name!r}: the colours, newline and end token need distinct ids, got "
                          f"{grid}")
    return GridFormat(name, tuple(grid[c] for c in layout.colours), grid[layout.newline],
                      tuple(map(one, layout.start)), tuple(map(one, layout.input_head)),
                      tuple(map(one, layout.output_head)), grid[layout.end], one(layout.pad), layout.last_newline,
                      layout)


KIT16 = resolve("kit16", {text: [i] for i, text in enumerate(TOKENS)}, VOCAB, "submission/grid/format.py")


def read_format(model_dir: str | Path, name: str) -> GridFormat:
    """The format `name` with the ids of the checkpoint's tokenizer.json, checked against its config.json's
    vocab_size: run before any weight is loaded, so a checkpoint that cannot write a grid is refused at once."""
    from tokenizers import Tokenizer

    model_dir = Path(model_dir)
    where = str(model_dir / "tokenizer.json")
    try:
        tokenizer = Tokenizer.from_file(where)
        config = json.loads((model_dir / "config.json").read_text())
    except Exception as err:  # noqa: BLE001 - tokenizers raises its own; OSError, JSON errors
        raise FormatError(f"{model_dir}: cannot read the tokenizer or config: {err}") from err
    vocab_size = config.get("vocab_size", config.get("text_config", {}).get("vocab_size"))
    if not isinstance(vocab_size, int):
        raise FormatError(f"{model_dir / 'config.json'}: vocab_size is missing")
    layout = LAYOUTS.get(name)
    texts = set() if layout is None else {*layout.colours, layout.newline, layout.end, layout.pad, *layout.start,
                                          *layout.input_head, *layout.output_head}
    ids_of = {}
    for text in texts:
        try:
            found = tokenizer.encode(text, add_special_tokens=False).ids
        except Exception:  # noqa: BLE001 - a WordLevel model without its unknown token raises on a string it lacks
            found = []
        # an unknown string that encodes to the unknown token does not decode back: it counts as no id
        ids_of[text] = found if tokenizer.decode(found, skip_special_tokens=False) == text else []
    return resolve(name, ids_of, vocab_size, where)


def grid_ids(grid: Grid, fmt: GridFormat = KIT16) -> list[int]:
    ids = [token for row in grid for token in (*(fmt.colours[cell] for cell in row), fmt.newline)]
    return ids if fmt.last_newline else ids[:-1]


def answer_ids(grid: Grid, fmt: GridFormat = KIT16) -> list[int]:
    """An output grid as the model writes it: the grid, then the end token (what the loss and the rescoring score)."""
    return [*grid_ids(grid, fmt), fmt.eos]


def pair_ids(pair: Pair, fmt: GridFormat = KIT16) -> tuple[list[int], list[bool]]:
    """One demonstration and its loss mask (True on the output grid and its end token)."""
    head = query_ids(pair.input, fmt)
    tail = answer_ids(pair.output, fmt)
    return head + tail, [False] * len(head) + [True] * len(tail)


def query_ids(test_input: Grid, fmt: GridFormat = KIT16) -> list[int]:
    return [*fmt.input_head, *grid_ids(test_input, fmt), *fmt.output_head]


@dataclass(frozen=True)
class Encoded:
    ids: tuple[int, ...]
    output_mask: tuple[bool, ...]  # where training puts its loss
    shown: int  # demonstrations kept (the last `shown` of those given)


def encode(demonstrations: tuple[Pair, ...], query: Grid | None = None, answer: Grid | None = None,
           max_len: int = 8192, fmt: GridFormat = KIT16) -> Encoded:
    """The start, the demonstrations that fit (cut from the front), then the query (and its answer, for training
    and rescoring). Raises ValueError if the query (with its answer) alone exceeds max_len."""
    tail: list[int] = []
    tail_mask: list[bool] = []
    if query is not None:
        tail = query_ids(query, fmt)
        tail_mask = [False] * len(tail)
        if answer is not None:
            out = answer_ids(answer, fmt)
            tail += out
            tail_mask += [True] * len(out)
    start = len(fmt.start)
    if start + len(tail) > max_len:
        raise ValueError(f"the query takes {start + len(tail)} tokens, more than the context of {max_len}")
    parts = [pair_ids(p, fmt) for p in demonstrations]
    used = start + len(tail)
    kept = 0
    for ids, _ in reversed(parts):
        if used + len(ids) > max_len:
            break
        used += len(ids)
        kept += 1
    ids, mask = list(fmt.start), [False] * start
    for pair, pair_mask in parts[len(parts) - kept:]:
        ids += pair
        mask += pair_mask
    return Encoded(tuple(ids + tail), tuple(mask + tail_mask), kept)


def decode_grid(ids: list[int] | tuple[int, ...], fmt: GridFormat = KIT16) -> Grid:
    """The grid of an answer (its rows, then the end token, which may be absent); the exact inverse of `grid_ids`
    (+ the end token)."""
    ids = list(ids)
    if ids and ids[-1] == fmt.eos:
        ids.pop()
    if not fmt.last_newline:
        ids.append(fmt.newline)  # the last row, ended as kit16 ends it
    colour_of = fmt.colour_of
    rows: list[tuple[int, ...]] = []
    row: list[int] = []
    for position, token in enumerate(ids):
        if token == fmt.newline:
            if not row or (rows and len(row) != len(rows[0])):
                raise FormatError(f"token {position}: row {len(rows)} has {len(row)} cells")
            rows.append(tuple(row))
            row = []
        elif token in colour_of:
            row.append(colour_of[token])
        else:
            raise FormatError(f"token {position}: {fmt.text(token)} inside a grid")
    if row or not rows:
        raise FormatError("the grid does not end with a complete row")
    if len(rows) > MAX_SIDE or len(rows[0]) > MAX_SIDE:
        raise FormatError(f"grid of {len(rows)}x{len(rows[0])} exceeds {MAX_SIDE}x{MAX_SIDE}")
    return tuple(rows)


def _find(ids: list[int], part: tuple[int, ...], start: int) -> int:
    """Where `part` next occurs in ids from `start`; -1 if it does not."""
    for position in range(start, len(ids) - len(part) + 1):
        if tuple(ids[position:position + len(part)]) == part:
            return position
    return -1


def decode_sequence(ids: list[int] | tuple[int, ...], fmt: GridFormat = KIT16) -> list[tuple[Grid, Grid | None]]:
    """The (input, output) pairs of an encoded sequence, the query's output None if it has no answer yet: the
    inverse of `encode` (used by the round-trip tests and to read sequences back when debugging)."""
    ids = list(ids)
    if tuple(ids[:len(fmt.start)]) != fmt.start:
        raise FormatError(f"a {fmt.name} sequence starts with {list(fmt.layout.start)}")
    pairs: list[tuple[Grid, Grid | None]] = []
    position = len(fmt.start)
    while position < len(ids):
        if tuple(ids[position:position + len(fmt.input_head)]) != fmt.input_head:
            raise FormatError(f"token {position}: expected {''.join(fmt.layout.input_head)!r}")
        end = _find(ids, fmt.output_head, position + len(fmt.input_head))
        if end < 0:
            raise FormatError(f"token {position}: an input grid without the output head")
        grid_in = decode_grid(ids[position + len(fmt.input_head):end], fmt)
        first = end + len(fmt.output_head)
        stop = ids.index(fmt.eos, first) if fmt.eos in ids[first:] else len(ids)
        pairs.append((grid_in, decode_grid(ids[first:stop], fmt) if stop > first else None))
        position = stop + 1
    return pairs


@dataclass(frozen=True)
class GridState:
    """Where an answer being written stands: cells in the current row, the width fixed by the first row (0 before
    it ends), rows finished. The grammar of SPEC section 10's search: rectangular rows, 1..max_side each way, in the
    format's ids (without `last_newline` a row is ended by the next row's newline or by the end token)."""

    in_row: int = 0
    width: int = 0
    rows: int = 0
    done: bool = False

    def legal(self, max_side: int = MAX_SIDE, fmt: GridFormat = KIT16) -> tuple[int, ...]:
        if self.done:
            return ()
        out: list[int] = []
        limit = self.width or max_side
        if self.in_row < limit and self.rows < max_side:
            out += fmt.colours
        row_full = self.in_row > 0 and (self.width == 0 or self.in_row == self.width)
        if fmt.last_newline:
            if row_full:
                out.append(fmt.newline)
            if self.in_row == 0 and self.rows > 0:
                out.append(fmt.eos)
        elif row_full:
            if self.rows + 1 < max_side:
                out.append(fmt.newline)
            out.append(fmt.eos)
        return tuple(out)

    def advance(self, token: int, fmt: GridFormat = KIT16) -> GridState:
        if token == fmt.eos:
            return GridState(0, self.width or self.in_row, self.rows + (self.in_row > 0), True)
        if token == fmt.newline:
            return GridState(0, self.width or self.in_row, self.rows + 1)
        return GridState(self.in_row + 1, self.width, self.rows)
