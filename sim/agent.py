"""The tool agent in the simulator: an agent attempt as the chain of requests it was, with turns learned from logs.

The solver logs each tool-agent attempt's tokens per turn (`turn_tokens`) and the tokens of the tool turns it wrote
(`tool_tokens`; submission.reasoning.solve). A simulated agent attempt runs its turns one after another on the serving
model: turn k + 1 is submitted when turn k finishes, its prompt the first prompt plus every earlier turn's tokens and
tool turns, prefilled again in full (the shipped MoE profile runs without prefix caching, and the serving model has
none). The scheduler sees the attempt finish with its last turn, as in the solver.

Learned from the logs (`TurnModel.fit`): per number of turns, the mean share of an attempt's tokens in each turn, and
the mean length of a tool turn. A record with several turns but no per-turn tokens (a log written before they were
logged) is split by those shares, evenly where the logs hold no attempt of that many turns, with the mean tool turn.

Approximate (said in the README): the seconds a sandbox check takes between two turns are not modelled (seconds,
against minutes for a turn); an attempt cut to a smaller simulated cap (sim.pool rule 3) runs as one request.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

from sim.serving import Job
from submission.attempts import AttemptRecord

TURN = "turn"  # the key of a job that is one turn of an agent attempt ends with (TURN, index)


@dataclass(frozen=True)
class TurnModel:
    shares: dict[int, tuple[float, ...]]  # turns -> mean share of the attempt's tokens in each turn
    tool_turn: float  # mean tokens of one tool turn
    attempts: Counter  # turns -> agent attempts logged with that many turns and their per-turn tokens

    @classmethod
    def fit(cls, records: list[AttemptRecord]) -> TurnModel:
        sums: dict[int, list[float]] = {}
        counts: Counter = Counter()
        tool, tool_turns = 0, 0
        for r in records:
            if len(r.turn_tokens) < 2 or sum(r.turn_tokens) <= 0:
                continue
            n = len(r.turn_tokens)
            counts[n] += 1
            total = sum(r.turn_tokens)
            sums[n] = [s + t / total for s, t in zip(sums.get(n, [0.0] * n), r.turn_tokens)]
            tool, tool_turns = tool + r.tool_tokens, tool_turns + n - 1
        return cls({n: tuple(s / counts[n] for s in v) for n, v in sums.items()},
                   tool / tool_turns if tool_turns else 0.0, counts)

    def split(self, record: AttemptRecord) -> tuple[tuple[int, ...], int]:
        """(tokens of each turn, tokens of each tool turn) of a logged attempt; ((), 0) for one request."""
        if record.turns < 2 and len(record.turn_tokens) < 2:
            return (), 0
        if len(record.turn_tokens) >= 2:
            return record.turn_tokens, round(record.tool_tokens / (len(record.turn_tokens) - 1))
        n, total = record.turns, record.tokens
        shares = self.shares.get(n, tuple(1 / n for _ in range(n)))
        turns = [int(total * s) for s in shares[:-1]]
        return tuple(turns + [total - sum(turns)]), round(self.tool_turn)

    def summary(self) -> str:
        """One line for the report: what was learned."""
        if not self.attempts:
            return "tool agent: no attempt with per-turn tokens in the logs (an agent attempt runs as one request)"
        shape = "; ".join(f"{n} turns x{self.attempts[n]}: " + " / ".join(f"{s:.0%}" for s in self.shares[n])
                          for n in sorted(self.attempts))
        return f"tool agent, learned from the logs: {shape} of the tokens; tool turn {self.tool_turn:.0f} tokens"


def first_turn(job: Job, turns: tuple[int, ...]) -> Job:
    """The job of an attempt's first request: itself for one request, else its first turn."""
    return job if len(turns) < 2 else replace(job, key=job.key + (TURN, 0), tokens=turns[0])


def next_turn(job: Job, turns: tuple[int, ...], tool_turn: int) -> Job | None:
    """The job of the turn after `job` (its prompt holds the conversation so far), or None after the last."""
    if len(turns) < 2 or job.key[-2:-1] != (TURN,):
        return None
    index = job.key[-1] + 1
    if index >= len(turns):
        return None
    return Job(job.key[:-1] + (index,), job.prompt + job.tokens + tool_turn, turns[index], job.payload)
