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
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np

from submission.grid.format import EOS, GridState
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


@dataclass(frozen=True)
class Found:
    tokens: tuple[int, ...]  # the answer, <eos> included
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
           deadline: float = math.inf, clock: Callable[[], float] = lambda: 0.0) -> SearchResult:
    """Every legal answer after `prompt` with probability >= cutoff, most probable first."""
    if not 0 < cutoff <= 1:
        raise ValueError(f"search cut-off must be in (0, 1], got {cutoff}")
    floor = np.float32(math.log(cutoff))
    found: list[Found] = []
    steps = 0
    if clock() > deadline:
        return SearchResult((), False, 0)
    # a frame: grammar state, the children still to try (token, cumulative logp), cache length at this node, tokens
    root_logp = stepper.prefill(prompt)
    base = stepper.length
    stack = [(GridState(), _children(GridState(), root_logp, np.float32(0), floor, max_side), base, ())]
    while stack:
        state, children, length, tokens = stack[-1]
        if not children:
            stack.pop()
            continue
        token, score = children.pop()
        if token == EOS:
            found.append(Found((*tokens, EOS), float(score)))
            continue
        if clock() > deadline:
            return SearchResult(tuple(sorted(found, key=lambda f: -f.logp)), False, steps)
        if stepper.length != length:
            stepper.truncate(length)
        logp = stepper.push(token)
        steps += 1
        child = state.advance(token)
        stack.append((child, _children(child, logp, score, floor, max_side), length + 1, (*tokens, token)))
    return SearchResult(tuple(sorted(found, key=lambda f: -f.logp)), True, steps)


def _children(state: GridState, logp: np.ndarray, score: np.float32, floor: np.float32,
              max_side: int) -> list[tuple[int, np.float32]]:
    """The children above the cut-off, least probable first (the stack pops the most probable first)."""
    legal = state.legal(max_side)
    if not legal:
        return []
    scores = (score + _legal_logp(logp, legal)).astype(np.float32)
    keep = [(t, s) for t, s in zip(legal, scores) if s >= floor]
    return sorted(keep, key=lambda c: c[1])



def greedy(stepper: Stepper, prompt: Sequence[int], max_side: int = MAX_SIDE, deadline: float = math.inf,
           clock: Callable[[], float] = lambda: 0.0) -> Found | None:
    """The most probable legal token at every step: the fallback when no answer clears the cut-off. None if the
    deadline comes first."""
    if clock() > deadline:
        return None
    logp, state, tokens, score = stepper.prefill(prompt), GridState(), [], np.float32(0)
    while True:
        legal = state.legal(max_side)
        scores = _legal_logp(logp, legal)
        best = int(np.argmax(scores))
        token, score = legal[best], np.float32(score + scores[best])
        tokens.append(token)
        if token == EOS:
            return Found(tuple(tokens), float(score))
        if clock() > deadline:
            return None
        logp = stepper.push(token)
        state = state.advance(token)
