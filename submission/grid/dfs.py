"""Depth-first search over the grid grammar: every answer whose probability stays >= a cut-off (SPEC section 10).

A greedy or sampled answer is one guess; the search returns all answers the model gives at least `cutoff`
probability (0.2 in the study: at most five), which is what the rescoring then ranks. Probabilities are those of
the model restricted to the legal tokens (`GridState.legal`: rectangular rows, 1..max_side each way), i.e.
renormalised over them, as constrained decoding samples them. Since a prefix's probability bounds every
continuation's, pruning a branch below the cut-off is exact: the result is the set brute-force enumeration finds
(tests/test_grid_dfs.py checks that on a tiny model).

The model is behind `Stepper`: the prompt is run once, then one token per step, and leaving a branch rolls the KV
cache back to the branch point (`truncate`), so no prefix is ever run twice. Scores are float32. A deadline stops
the search cleanly: answers found so far are kept, the rest of the tree is left unexplored (`complete` = False).

`search_batch` walks several views' trees in lockstep behind a `BatchStepper` (one cache row per view): one model
call per step for all of them, which is what keeps a GPU busy where one token of one view does not (issue 18).
Each view's walk is the one `search` makes, so both find the same answers (tests/test_grid_dfs.py).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from submission.grid.format import KIT16, GridFormat, GridState
from submission.grids import MAX_SIDE


class Stepper(Protocol):
    """A model with a KV cache that can be extended one token at a time and cut back."""

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        """Start over: run `ids`, return the next token's log-probabilities (float32, one per vocabulary entry)."""

    def push(self, token: int) -> np.ndarray:
        """Append one token, return the next token's log-probabilities."""

    def truncate(self, length: int) -> None:
        """Drop everything after the first `length` tokens."""

    @property
    def length(self) -> int: ...


class BatchStepper(Protocol):
    """Several prompts' KV caches in one batch (one row each), every row extended by one token per model call."""

    def prefill(self, prompts: Sequence[Sequence[int]]) -> list[np.ndarray]:
        """Start over with one row per prompt; each row's next-token log-probabilities."""

    def push(self, moves: Sequence[tuple[int, int, int]]) -> np.ndarray:
        """Per move (row, length, token): cut the row back to its first `length` tokens and append `token`; one
        model call for all of them; the log-probabilities, one row per move. Rows are in increasing order, and a row
        left out is finished: its cache is freed and it never comes back."""


@dataclass(frozen=True)
class Found:
    tokens: tuple[int, ...]  # the answer, its end token included
    logp: float  # float32 log-probability under the legal-token distribution


@dataclass(frozen=True)
class SearchResult:
    found: tuple[Found, ...]  # most probable first
    complete: bool  # False: the deadline stopped the search
    steps: int  # tokens run through the model after the prompt


def _legal_logp(logp: np.ndarray, legal: tuple[int, ...]) -> np.ndarray:
    chosen = logp[list(legal)].astype(np.float32)
    top = chosen.max()
    return (chosen - (top + np.log(np.exp(chosen - top).sum()))).astype(np.float32)


def search(stepper: Stepper, prompt: Sequence[int], cutoff: float, max_side: int = MAX_SIDE,
           deadline: float = math.inf, clock: Callable[[], float] = lambda: 0.0,
           fmt: GridFormat = KIT16) -> SearchResult:
    """Every legal answer after `prompt` with probability >= cutoff, most probable first."""
    floor = _floor(cutoff)
    if clock() > deadline:
        return SearchResult((), False, 0)
    walk = _Walk(stepper.prefill(prompt), stepper.length, floor, max_side, fmt)
    while (move := walk.next()) is not None:
        if clock() > deadline:
            return walk.result(False)
        token, length = move
        if stepper.length != length:
            stepper.truncate(length)
        walk.take(stepper.push(token))
    return walk.result(True)


def search_batch(stepper: BatchStepper, prompts: Sequence[Sequence[int]], cutoff: float, max_side: int = MAX_SIDE,
                 deadline: float = math.inf, clock: Callable[[], float] = lambda: 0.0,
                 fmt: GridFormat = KIT16) -> list[SearchResult]:
    """`search` for several prompts (the views of one test input) in lockstep: each model call advances every view
    whose walk is not done by one token. Each view walks its tree in the order `search` does, so a search that
    finishes finds what `search` finds (up to float rounding between batched and single model calls); at the
    deadline every view stops where it is (a view already done stays complete)."""
    floor = _floor(cutoff)
    if clock() > deadline:
        return [SearchResult((), False, 0) for _ in prompts]
    walks = [_Walk(logp, len(prompt), floor, max_side, fmt) for logp, prompt in zip(stepper.prefill(prompts), prompts)]
    live = list(range(len(walks)))
    while True:
        moves = []
        for row in live:
            move = walks[row].next()
            if move is not None:
                moves.append((row, move[1], move[0]))
        live = [row for row, _, _ in moves]
        if not moves:
            return [walk.result(True) for walk in walks]
        if clock() > deadline:
            return [walk.result(row not in live) for row, walk in enumerate(walks)]
        for row, logp in zip(live, stepper.push(moves)):
            walks[row].take(logp)


def _floor(cutoff: float) -> np.float32:
    if not 0 < cutoff <= 1:
        raise ValueError(f"search cut-off must be in (0, 1], got {cutoff}")
    return np.float32(math.log(cutoff))


class _Walk:
    """One view's depth-first walk, advanced by its caller one model step at a time, so that one view (`search`)
    or several in lockstep (`search_batch`) walk the same tree in the same order. A stack frame: grammar state, the
    children still to try (token, cumulative logp), the cache length at this node, the tokens so far."""

    def __init__(self, root_logp: np.ndarray, base: int, floor: np.float32, max_side: int, fmt: GridFormat) -> None:
        self.floor, self.max_side, self.fmt = floor, max_side, fmt
        self.stack = [(GridState(), _children(GridState(), root_logp, np.float32(0), floor, max_side, fmt), base,
                       ())]
        self.found: list[Found] = []
        self.steps = 0
        self.pending: tuple | None = None

    def next(self) -> tuple[int, int] | None:
        """The next token to run and the cache length it extends (its branch point), answers ending before it
        recorded; None when the tree is exhausted."""
        while self.stack:
            state, children, length, tokens = self.stack[-1]
            if not children:
                self.stack.pop()
                continue
            token, score = children.pop()
            if token == self.fmt.eos:
                self.found.append(Found((*tokens, token), float(score)))
                continue
            self.pending = (state, token, score, length, tokens)
            return token, length
        return None

    def take(self, logp: np.ndarray) -> None:
        """The model's next-token log-probabilities after the token `next` gave."""
        state, token, score, length, tokens = self.pending
        self.steps += 1
        child = state.advance(token, self.fmt)
        self.stack.append((child, _children(child, logp, score, self.floor, self.max_side, self.fmt), length + 1,
                           (*tokens, token)))

    def result(self, complete: bool) -> SearchResult:
        return SearchResult(tuple(sorted(self.found, key=lambda f: -f.logp)), complete, self.steps)


def _children(state: GridState, logp: np.ndarray, score: np.float32, floor: np.float32,
              max_side: int, fmt: GridFormat) -> list[tuple[int, np.float32]]:
    """The children above the cut-off, least probable first (the stack pops the most probable first)."""
    legal = state.legal(max_side, fmt)
    if not legal:
        return []
    scores = (score + _legal_logp(logp, legal)).astype(np.float32)
    keep = [(t, s) for t, s in zip(legal, scores) if s >= floor]
    return sorted(keep, key=lambda c: c[1])



def greedy(stepper: Stepper, prompt: Sequence[int], max_side: int = MAX_SIDE, deadline: float = math.inf,
           clock: Callable[[], float] = lambda: 0.0, fmt: GridFormat = KIT16) -> Found | None:
    """The most probable legal token at every step: the fallback when no answer clears the cut-off. None if the
    deadline comes first."""
    if clock() > deadline:
        return None
    logp, state, tokens, score = stepper.prefill(prompt), GridState(), [], np.float32(0)
    while True:
        legal = state.legal(max_side, fmt)
        scores = _legal_logp(logp, legal)
        best = int(np.argmax(scores))
        token, score = legal[best], np.float32(score + scores[best])
        tokens.append(token)
        if token == fmt.eos:
            return Found(tuple(tokens), float(score))
        if clock() > deadline:
            return None
        logp = stepper.push(token)
        state = state.advance(token, fmt)
