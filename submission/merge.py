"""One answer selection per test input from both lines (issue 18, item 8): the kit's rule, not the study's. Pure.

The reasoning line's candidates (submission.selection: direct grids, train-perfect program outputs, transferred ones)
and the grid line's (submission.grid.rescore: each distinct grid with its search hits and rescoring NLL) are ranked
in four tiers; the first two distinct grids are the attempts:
1. outputs of train-perfect programs (own, or transferred where they stand in for them), in the reasoning line's
   own order (selection.rank): right 73-78% of the time in the study, the most reliable evidence either line has;
2. grid-line candidates that at least one search view found (hits >= 1), by score = hits - mean NLL;
3. the reasoning line's direct grids, by votes (selection.rank's order among them);
4. the grid line's greedy fallback (0 hits: nothing cleared the search's cut-off).
A grid both lines propose appears once, in its best tier. Why tier 2 before tier 3: a grid-line candidate survived a
search over 16 views and a rescoring over 8, a direct grid of a reasoning attempt is one sample. The study ran the
lines separately (no measured rule exists): `sim.grid --reasoning-log` forecasts this rule against each line alone.
"""

from __future__ import annotations

from collections.abc import Sequence

from submission.attempts import AttemptRecord
from submission.grid.rescore import Candidate as GridCandidate
from submission.grid.rescore import rank as grid_rank
from submission.grids import EMPTY_ANSWER, Grid
from submission.selection import Candidate, Candidates, rank


def merged_order(reasoning: Sequence[Candidate], grid_line: Sequence[GridCandidate]) -> list[Grid]:
    """Every distinct grid of both lines, best first, by the four tiers of the module doc."""
    ranked = rank(list(reasoning))
    found = grid_rank([c for c in grid_line if c.hits >= 1])
    fallback = grid_rank([c for c in grid_line if c.hits < 1])
    order = [r.grid for r in ranked if r.from_program]
    order += [c.grid for c in found]
    order += [r.grid for r in ranked if not r.from_program]
    order += [c.grid for c in fallback]
    return list(dict.fromkeys(order))


def merged_answers(reasoning: Sequence[Candidate], grid_line: Sequence[GridCandidate]) -> tuple[Grid, Grid]:
    """attempt_1 and attempt_2 for one test input; `[[0]]` fills what neither line has."""
    order = merged_order(reasoning, grid_line)[:2]
    order += [EMPTY_ANSWER] * (2 - len(order))
    return order[0], order[1]


def grid_candidates(records: Sequence[AttemptRecord]) -> dict[tuple[str, int], list[GridCandidate]]:
    """Per test input, the candidates of a grid-line log (attempt 1 carries them); a task logged twice (redone
    after a kill) counts with its last records."""
    out = {}
    for record in records:
        if record.attempt == 1 and record.grid_line is not None and record.grid_line.candidates is not None:
            out[(record.task_id, record.test_index)] = [GridCandidate.from_json(c) for c in record.grid_line.candidates]
    return out


def merge_logs(test_counts: dict[str, int], reasoning: Sequence[AttemptRecord],
               grid_line: Sequence[AttemptRecord], transfer: bool = True) -> dict[tuple[str, int], tuple[Grid, Grid]]:
    """The merged answers of every test input either log has something for, from the two lines' logs; `transfer`:
    the reasoning line's profile's (SelectionConfig)."""
    known = Candidates(transfer=transfer)
    for record in reasoning:
        if record.task_id in test_counts:
            known.add_record(record)
    found = {key: c for key, c in grid_candidates(grid_line).items() if key[0] in test_counts}
    keys = sorted(set(known.by_input) | set(found))
    return {key: merged_answers(known.by_input.get(key, []), found.get(key, [])) for key in keys}
