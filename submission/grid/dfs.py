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

A search may be seeded with a guess, the best answer found so far in the other views (ARChitects' `pass_guess`,
issue 29): the guess is run with the prompt in the same prefill and walked first, so its path costs no decode step
and only the branches off it are decoded token by token. Pruning stays exact, so a seeded search finds the same
answers (tests/test_grid_dfs.py); with a trained model, whose views mostly agree, the guess is most of the tree
(benchmarks/grid_search.py).

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

    def prefill(self, ids: Sequence[int], guess: Sequence[int] = ()) -> np.ndarray:
        """Start over: run `ids` then `guess` in one model call; the next token's log-probabilities (float32, one per
        vocabulary entry) after `ids` and after each guess token, one row each."""

    def push(self, token: int) -> np.ndarray:
        """Append one token, return the next token's log-probabilities."""

    def truncate(self, length: int) -> None:
        """Drop everything after the first `length` tokens."""

    @property
    def length(self) -> int: ...


class BatchStepper(Protocol):
    """Several prompts' KV caches in one batch (one row each), every row extended by one token per model call."""

    def prefill(self, prompts: Sequence[Sequence[int]],
                guesses: Sequence[Sequence[int]] | None = None) -> list[np.ndarray]:
        """Start over with one row per prompt, each followed by its guess; per row the next-token log-probabilities
        after the prompt and after each guess token (as `Stepper.prefill`)."""

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
           guess: Sequence[int] = (), fmt: GridFormat = KIT16) -> SearchResult:
    """Every legal answer after `prompt` with probability >= cutoff, most probable first. `guess` (an answer's
    tokens, the format's end token included: the best answer found so far, mapped into this view) is run with the
    prompt in one call and walked first, so only the branches off it are decoded token by token; the answers are the
    same."""
    floor = _floor(cutoff)
    if clock() > deadline:
        return SearchResult((), False, 0)
    guess = _answer(guess, fmt)
    walk = _Walk(stepper.prefill(prompt, guess[:-1]), len(prompt), floor, max_side, fmt, guess)
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
                 guesses: Sequence[Sequence[int]] | None = None, fmt: GridFormat = KIT16) -> list[SearchResult]:
    """`search` for several prompts (the views of one test input) in lockstep: each model call advances every view
    whose walk is not done by one token. Each view walks its tree in the order `search` does, so a search that
    finishes finds what `search` finds (up to float rounding between batched and single model calls); at the
    deadline every view stops where it is (a view already done stays complete). `guesses`: one per prompt, as
    `search`'s guess."""
    floor = _floor(cutoff)
    if clock() > deadline:
        return [SearchResult((), False, 0) for _ in prompts]
    guesses = [_answer(g, fmt) for g in (guesses or [()] * len(prompts))]
    rows = stepper.prefill(prompts, [g[:-1] for g in guesses])
    walks = [_Walk(r, len(p), floor, max_side, fmt, g) for r, p, g in zip(rows, prompts, guesses)]
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


def _answer(guess: Sequence[int], fmt: GridFormat) -> tuple[int, ...]:
    """The guess, which is an answer (one end token, at its end) or () for none."""
    guess = tuple(guess)
    if guess and (guess[-1] != fmt.eos or fmt.eos in guess[:-1]):
        raise ValueError(f"a search's guess is an answer ending in its one <eos>, got {list(guess)}")
    return guess


def _floor(cutoff: float) -> np.float32:
    if not 0 < cutoff <= 1:
        raise ValueError(f"search cut-off must be in (0, 1], got {cutoff}")
    return np.float32(math.log(cutoff))


class _Walk:
    """One view's depth-first walk, advanced by its caller one model step at a time, so that one view (`search`)
    or several in lockstep (`search_batch`) walk the same tree in the same order. A stack frame: grammar state, the
    children still to try (token, cumulative logp), the cache length at this node, the tokens so far.

    With a guess, `rows` holds the log-probabilities after the prompt and after each guess token (one prefill): the
    guess's child is tried first at every node on its path, so the walk goes down the guess without a model call,
    and the first model call (a branch off it, or the guess cut off) ends that descent for good: the tree below a
    node is done before its siblings, so the guess path is never walked again. Children on the guess path are in
    the guess's order, not the model's, which changes the order answers are found in, never which ones."""

    def __init__(self, rows: Sequence[np.ndarray], base: int, floor: np.float32, max_side: int, fmt: GridFormat,
                 guess: tuple[int, ...] = ()) -> None:
        self.floor, self.max_side, self.fmt, self.guess = floor, max_side, fmt, guess
        self.ahead = list(rows[1:])  # after each guess token, while the walk is still going down the guess
        root = GridState()
        self.stack = [(root, self._children(root, rows[0], np.float32(0), 0), base, ())]
        self.found: list[Found] = []
        self.steps = 0
        self.pending: tuple | None = None

    def next(self) -> tuple[int, int] | None:
        """The next token to run and the cache length it extends (its branch point), answers ending before it
        recorded and the guess's tokens taken from the prefill; None when the tree is exhausted."""
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
            if len(tokens) < len(self.ahead) and token == self.guess[len(tokens)]:
                self._grow(self.ahead[len(tokens)])
                continue
            self.ahead = []  # a model call: the cache past this branch point is cut back
            return token, length
        return None

    def take(self, logp: np.ndarray) -> None:
        """The model's next-token log-probabilities after the token `next` gave."""
        self.steps += 1
        self._grow(logp)

    def _grow(self, logp: np.ndarray) -> None:
        state, token, score, length, tokens = self.pending
        child = state.advance(token, self.fmt)
        self.stack.append((child, self._children(child, logp, score, len(tokens) + 1), length + 1, (*tokens, token)))

    def _children(self, state: GridState, logp: np.ndarray, score: np.float32,
                  depth: int) -> list[tuple[int, np.float32]]:
        """The children above the cut-off, in the order the stack pops them last: least probable first, except
        that the guess's token goes last (first tried) while the walk is on the guess."""
        children = _children(state, logp, score, self.floor, self.max_side, self.fmt)
        if depth < len(self.guess) and (depth == 0 or self.ahead):
            children.sort(key=lambda c: c[0] == self.guess[depth])  # stable: the rest keep their order
        return children

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
    logp, state, tokens, score = stepper.prefill(prompt)[0], GridState(), [], np.float32(0)
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
