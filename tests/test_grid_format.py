"""The grid line's 16-token format: exact round trips on every ARC-AGI-2 training task, context cutting, grammar."""

from __future__ import annotations

import itertools
import random

import pytest

from submission.grid.format import (BOS, EOS, INPUT, NEWLINE, OUTPUT, FormatError, GridState, decode_grid,
                                    decode_sequence, encode, grid_ids)
from submission.tasks import load_tasks
from submission.views import random_view


def test_every_training_task_round_trips_through_ids(arc_data):
    """render -> ids -> grids is exact for every demonstration and test pair of ARC-AGI-2 training, in the
    task's own frame and under a random view mapped back."""
    tasks = load_tasks(arc_data / "arc-agi-2" / "training").tasks
    assert len(tasks) == 1000
    rng = random.Random(0)
    for task in tasks:
        for index, (test_in, test_out) in enumerate(zip(task.test_inputs, task.test_outputs)):
            encoded = encode(task.train, test_in, test_out, max_len=1 << 20)
            assert encoded.shown == len(task.train)
            pairs = decode_sequence(encoded.ids)
            assert pairs == [(p.input, p.output) for p in task.train] + [(test_in, test_out)], task.id
            # the loss mask covers exactly the output grids and their <eos>
            outputs = sum(len(grid_ids(p.output)) + 1 for p in task.train) + len(grid_ids(test_out)) + 1
            assert sum(encoded.output_mask) == outputs
        view = random_view(rng, len(task.train), keep_zero=False)
        for grid in (task.train[0].input, task.train[-1].output, task.test_inputs[0]):
            assert view.invert_grid(decode_grid(grid_ids(view.apply_grid(grid)) + [EOS])) == grid


def test_demonstrations_are_cut_from_the_front(arc_data):
    task = load_tasks(arc_data / "arc-agi-2" / "training").tasks[0]
    full = encode(task.train, task.test_inputs[0])
    tail = 1 + len(grid_ids(task.test_inputs[0])) + 2
    last = len(grid_ids(task.train[-1].input)) + len(grid_ids(task.train[-1].output)) + 3
    cut = encode(task.train, task.test_inputs[0], max_len=tail + last)
    assert cut.shown == 1 and len(cut.ids) == tail + last
    assert decode_sequence(cut.ids)[0] == (task.train[-1].input, task.train[-1].output)
    assert full.ids[-tail + 1:] == cut.ids[-tail + 1:]
    with pytest.raises(ValueError, match="query takes"):
        encode(task.train, task.test_inputs[0], max_len=tail - 1)


def test_bad_answers_are_refused():
    for ids, where in (([1, 2, NEWLINE, 3, NEWLINE], "row 1 has 1 cells"), ([1, 2], "complete row"),
                       ([EOS], "complete row"), ([1, INPUT, NEWLINE], "inside a grid")):
        with pytest.raises(FormatError, match=where):
            decode_grid(ids)
    with pytest.raises(FormatError, match="<bos>"):
        decode_sequence([INPUT, 1, NEWLINE, OUTPUT])


def _walk(max_side: int, alphabet: tuple[int, ...]) -> set[tuple[int, ...]]:
    """Every token sequence over `alphabet` the grammar admits (depth-first over GridState)."""
    out, stack = set(), [(GridState(), ())]
    while stack:
        state, seq = stack.pop()
        for token in set(state.legal(max_side)) & set(alphabet):
            if token == EOS:
                out.add(seq + (EOS,))
            else:
                stack.append((state.advance(token), seq + (token,)))
    return out


def test_grammar_admits_exactly_the_rectangular_grids():
    """With a 3-colour alphabet stand-in, the grammar's language is exactly every grid of 1..max_side each way."""
    max_side = 3
    admitted = _walk(max_side, (0, 1, NEWLINE, EOS))
    expected = set()
    for rows, cols in itertools.product(range(1, max_side + 1), repeat=2):
        for cells in itertools.product((0, 1), repeat=rows * cols):
            grid = tuple(tuple(cells[r * cols:(r + 1) * cols]) for r in range(rows))
            expected.add(tuple(grid_ids(grid)) + (EOS,))
    assert admitted == expected
    assert all(decode_grid(list(s)) for s in admitted)
    assert set(GridState().legal()) == set(range(10))
    assert BOS not in GridState(2, 3, 1).legal() and OUTPUT not in GridState(0, 3, 1).legal()
    full = GridState(0, 30, 30)  # 30 rows of 30 done: only the end is legal
    assert full.legal() == (EOS,)
