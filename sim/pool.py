"""Where simulated attempts come from: logged attempts, drawn by a documented rule, cut to the simulated cap.

For a request (input, attempt number, level, cap):
1. The input's own logged attempts: the one with the same attempt number, else one of the same level, else any one
   (chosen with the run's random generator). Grids, programs and their outputs are the logged ones.
2. An input with no logged attempt of its own (the hidden set is larger than the public one): an attempt of the same
   level drawn from the whole pool, else any. Only its lengths and correctness travel: a right grid becomes the
   input's true answer, a wrong one a wrong grid of its own; a train-perfect program's output likewise; no transfer.
   Its prompt is the input's own (prompt 0 here: the run uses the length the scheduler ordered the input by).
   A tool-agent attempt's further program candidates and weak pool do not travel (the first program stands for
   them).
A tool-agent attempt keeps its turns (the logged ones, or its tokens split as the logs' agent attempts were:
sim.agent) and runs as one request per turn; truncated (rule 3), as one request.
3. Truncation: when the logged thinking is longer than the simulated cap, the attempt becomes a forced completion of
   cap tokens. Its grid comes from one of the input's logged forced attempts if any, else it is right with probability
   `forced_accuracy` (SPEC: about 8% of forced completions are right); its program is not train-perfect.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from sim.agent import TurnModel
from submission.attempts import AttemptRecord, program_candidates
from submission.grids import Grid
from submission.schedule import Level, Outcome, Request


@dataclass(frozen=True)
class SimAttempt:
    thinking: int
    answer: int
    prompt: int  # 0: the input's own prompt length (rule 2)
    natural: bool
    grid: object | None  # a Grid, or a stand-in for the true / a wrong answer of a simulated input
    train_perfect: bool
    demos_right: int
    program_outputs: tuple  # per test input of the task; () when unknown
    source: str  # "own", "pool" (rule 2), plus "+cut" when truncated
    turns: tuple[int, ...] = ()  # a tool-agent attempt: tokens of each turn (sim.agent); () = one request
    tool_turn: int = 0  # tokens of each tool turn between them
    candidate_outputs: tuple = ()  # a tool-agent attempt's program candidates and weak pool (AttemptRecord's)
    weak_outputs: tuple = ()

    @property
    def tokens(self) -> int:
        return self.thinking + self.answer

    @property
    def program_candidates(self) -> tuple:
        return program_candidates(self.train_perfect, self.program_outputs, self.candidate_outputs)

    def outcome(self, request: Request) -> Outcome:
        return Outcome(request.task_id, request.test_index, request.attempt, request.level, self.natural,
                       self.grid, self.thinking, self.train_perfect, self.demos_right)


class AttemptPool:
    def __init__(self, records: list[AttemptRecord], truth: dict[tuple[str, int], object],
                 forced_accuracy: float = 0.08):
        """`truth`: the right answer of every simulated input (its label, or a stand-in for inputs made up)."""
        if not records:
            raise ValueError("the attempt pool is empty")
        self.truth = truth
        self.forced_accuracy = forced_accuracy
        self.records = [r for r in records if not r.aborted]
        self.by_input: dict[tuple[str, int], list[AttemptRecord]] = {}
        for r in self.records:
            self.by_input.setdefault((r.task_id, r.test_index), []).append(r)
        self.by_level: dict[Level, list[AttemptRecord]] = {}
        for r in self.records:
            self.by_level.setdefault(r.level, []).append(r)
        self.turn_model = TurnModel.fit(self.records)
        # Rule 1's choices and attempts, made once: a forecast draws the same slots a thousand times.
        self._by_attempt: dict[tuple, list[SimAttempt]] = {}  # (input, attempt number): in log order
        self._by_level: dict[tuple, list[SimAttempt]] = {}  # (input, level) (apart: Level.SECOND == 1)
        self._own_all: dict[tuple[str, int], list[SimAttempt]] = {}
        self._forced: dict[tuple[str, int], list[AttemptRecord]] = {}
        for key, own in self.by_input.items():
            for r in own:
                attempt = SimAttempt(r.thinking_tokens, r.answer_tokens, r.prompt_tokens, r.natural, r.grid,
                                     r.train_perfect, r.demos_right, r.program_outputs, "own",
                                     *self.turn_model.split(r), r.candidate_outputs, r.weak_outputs)
                self._by_attempt.setdefault((key, r.attempt), []).append(attempt)
                self._by_level.setdefault((key, r.level), []).append(attempt)
                self._own_all.setdefault(key, []).append(attempt)
            self._forced[key] = [r for r in own if not r.natural]
        self.logged = tuple(a for attempts in self._own_all.values() for a in attempts)  # rule 1's, made once
        self._pooled: dict[tuple, SimAttempt] = {}  # (record index, input, attempt number): rule 2's attempts

    def _right(self, record: AttemptRecord) -> bool:
        return record.grid is not None and record.grid == self.truth.get((record.task_id, record.test_index))

    def _program_right(self, record: AttemptRecord) -> bool:
        out = record.program_outputs
        return (record.train_perfect and record.test_index < len(out)
                and out[record.test_index] == self.truth.get((record.task_id, record.test_index)))

    @staticmethod
    def _wrong_grid(request: Request, kind: str) -> Grid:
        """A wrong answer of this slot: a stand-in, only compared for equality, unique to the slot and `kind` (so no
        two wrong answers vote together) and the same in every run (common random numbers)."""
        return (("wrong", request.task_id, request.test_index, request.attempt, kind),)  # type: ignore[return-value]

    def draw(self, request: Request, rng: random.Random) -> SimAttempt:
        key = request.key
        own = self._own_all.get(key)
        if own:
            same = self._by_attempt.get((key, request.attempt)) or self._by_level.get((key, request.level))
            attempt = same[0] if same is not None and len(same) == 1 else rng.choice(same or own)
        else:
            attempt = self._pooled_attempt(request, rng.choice(self.by_level.get(request.level) or self.records))
        return self._cut(attempt, request, rng)

    def _pooled_attempt(self, request: Request, record: AttemptRecord) -> SimAttempt:
        """Rule 2: the record's lengths and correctness on this slot (the same in every run: kept)."""
        slot = (id(record), request.key, request.attempt)
        attempt = self._pooled.get(slot)
        if attempt is None:
            truth = self.truth[request.key]
            grid = None if record.grid is None else truth if self._right(record) else self._wrong_grid(request, "grid")
            outputs: tuple = ()
            if record.train_perfect:
                outputs = tuple(None for _ in range(request.test_index)) + (
                    truth if self._program_right(record) else self._wrong_grid(request, "program"),)
            attempt = self._pooled[slot] = SimAttempt(record.thinking_tokens, record.answer_tokens, 0, record.natural,
                                                      grid, record.train_perfect, record.demos_right, outputs, "pool",
                                                      *self.turn_model.split(record))
        return attempt

    def _cut(self, attempt: SimAttempt, request: Request, rng: random.Random) -> SimAttempt:
        if attempt.thinking <= request.cap:
            return attempt
        forced = self._forced.get(request.key)
        if forced:
            grid = rng.choice(forced).grid
        else:
            grid = self.truth[request.key] if rng.random() < self.forced_accuracy else self._wrong_grid(request, "cut")
        return SimAttempt(request.cap, attempt.answer, attempt.prompt, False, grid, False, 0, (),
                          attempt.source + "+cut")
