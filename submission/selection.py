"""Answer selection for one test input (SPEC section 4): candidates in, `attempt_1` and `attempt_2` out. Pure.

Candidates are the direct grids of every attempt, the test outputs of train-perfect programs, and the outputs of
programs that were train-perfect for one of the task's other test inputs (transferred). Ranking:
1. grids with >= 2 votes, most votes first;
2. then grids that a train-perfect program of this input produced, by votes;
3. then the remaining direct grids, by votes;
4. transferred outputs, when this input has no train-perfect program of its own, take the place of its program
   outputs (tier 2) and vote with its grids; when it has one, they rank after all its grids and do not vote.
   Transfer is a profile setting (`[selection] transfer`, SelectionConfig): it entered with the MoE 53.33 run (seed
   ~3344-3346, runs table ~3510), so the dense 44.03 run's profile has it off and a program then counts only for
   the test input it was written for;
5. last, the weak pool: test outputs of the tool agent's programs that ran with a valid test output but are not
   program candidates (Algorithm 7 line 16, seed ~3466-3468). The study names the pool and what joins it, not how
   it is used; here its outputs do not vote and rank after every other candidate, in the order they came, so they
   only fill a slot that would otherwise get `[[0]]` and never displace a candidate the study's ranking places.
The study's sentence (SPEC 4): "Transferred outputs replace the program outputs of an input that has no train-perfect
program of its own and then vote with its grids". Read literally: they *replace the program outputs*, so they rank
as program outputs, and their votes add to equal grids'. (The other reading, that they rank as plain grids, differs
when a transferred output has one vote: here it goes before the input's single-vote grids.)
Ties go to the candidate seen first (attempt order), so selection is deterministic. Empty slots get `[[0]]`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from submission.attempts import AttemptRecord
from submission.grids import EMPTY_ANSWER, Grid


class Source(str, Enum):
    GRID = "grid"  # the direct answer grid of an attempt
    PROGRAM = "program"  # the test output of a train-perfect program of this test input
    TRANSFERRED = "transferred"  # the output of a program train-perfect on another test input of the task
    WEAK = "weak"  # the test output of a tool agent's program that ran but is not a program candidate (the weak pool)


@dataclass(frozen=True)
class SelectionConfig:
    """The profile's `[selection]` section."""

    transfer: bool = True  # a train-perfect program's outputs for the task's other test inputs are candidates there


@dataclass(frozen=True)
class Candidate:
    grid: Grid
    source: Source
    attempt: int = 0  # which attempt produced it (for records; order of arrival breaks ties)


@dataclass(frozen=True)
class Ranked:
    grid: Grid
    votes: int
    from_program: bool
    first_seen: int


def rank(candidates: list[Candidate] | tuple[Candidate, ...]) -> list[Ranked]:
    """Distinct grids, best first, by the rule in the module doc."""
    has_program = any(c.source is Source.PROGRAM for c in candidates)
    votes: dict[Grid, int] = {}
    programs: set[Grid] = set()
    first: dict[Grid, int] = {}
    late: dict[Grid, int] = {}  # transferred outputs that rank after all grids (the input has its own program)
    weak: dict[Grid, int] = {}  # the weak pool: after everything, no votes
    for i, c in enumerate(candidates):
        if c.source is Source.WEAK:
            weak.setdefault(c.grid, i)
            continue
        if c.source is Source.TRANSFERRED and has_program:
            late.setdefault(c.grid, i)
            continue
        votes[c.grid] = votes.get(c.grid, 0) + 1
        first.setdefault(c.grid, i)
        if c.source is not Source.GRID:  # a program output, or a transferred one standing in for it
            programs.add(c.grid)

    def tier(g: Grid) -> int:
        return 0 if votes[g] >= 2 else 1 if g in programs else 2

    ranked = [Ranked(g, votes[g], g in programs, first[g]) for g in votes]
    ranked.sort(key=lambda r: (tier(r.grid), -r.votes, not r.from_program, r.first_seen))
    ranked += [Ranked(g, 0, False, i) for g, i in sorted(late.items(), key=lambda kv: kv[1]) if g not in votes]
    ranked += [Ranked(g, 0, False, i) for g, i in sorted(weak.items(), key=lambda kv: kv[1])
               if g not in votes and g not in late]
    return ranked


def select(candidates: list[Candidate] | tuple[Candidate, ...]) -> tuple[Grid, Grid]:
    """attempt_1 and attempt_2: the first two distinct ranked grids, filled with [[0]]."""
    grids = [r.grid for r in rank(candidates)][:2]
    grids += [EMPTY_ANSWER] * (2 - len(grids))
    return grids[0], grids[1]


@dataclass
class Candidates:
    """Candidates per test input from finished attempts; `answers(key)` applies SPEC section 4. Pure state, shared
    by the solver and the simulator. `transfer` false (SelectionConfig): a program's outputs count only for the test
    input whose attempt wrote it."""

    by_input: dict[tuple[str, int], list[Candidate]] = field(default_factory=dict)
    transfer: bool = True

    def add(self, task_id: str, test_index: int, attempt: int, grid: Grid | None,
            programs: tuple[tuple[Grid | None, ...], ...], weak: tuple[Grid, ...] = ()) -> list[tuple[str, int]]:
        """Add an attempt's grid, the outputs of each of its program candidates (train-perfect programs, transferred
        to the task's other test inputs when `transfer`) and its weak pool (submission.selection). Returns the inputs
        whose candidates changed."""
        key = (task_id, test_index)
        found = [(key, Candidate(grid, Source.GRID, attempt))] if grid is not None else []
        for outputs in programs:
            found += [((task_id, index), Candidate(output, Source.PROGRAM if index == test_index else
                                                   Source.TRANSFERRED, attempt))
                      for index, output in enumerate(outputs)
                      if output is not None and (self.transfer or index == test_index)]
        found += [(key, Candidate(output, Source.WEAK, attempt)) for output in weak]
        for where, candidate in found:
            self.by_input.setdefault(where, []).append(candidate)
        return sorted({where for where, _ in found})

    def add_record(self, record: AttemptRecord) -> list[tuple[str, int]]:
        return self.add(record.task_id, record.test_index, record.attempt, record.grid, record.program_candidates,
                        record.weak_outputs)

    def answers(self, key: tuple[str, int]) -> tuple[Grid, Grid]:
        return select(self.by_input.get(key, []))
