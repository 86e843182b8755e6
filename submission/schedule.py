"""The deadline-aware schedule (SPEC section 5): a queue with levels, as a pure policy driven by the caller's clock.

The solver (real engine, wall clock) and the simulator (its own serving model, sim/serving.py, simulated clock) run
this same code; it does no I/O and never reads a clock: every method takes `now`, seconds since the run started.

Levels, lowest popped first:
- L0: attempt 1 of every test input, plain view; cap `cap_first_single` for single-input tasks, else `cap_first_multi`.
  Inputs with shorter prompts go first.
- L1: attempt 2, demonstrations reordered, queued when the input's first attempt finishes (it never waits for all first
  attempts). Second attempts run in the study's order (`second_priority`): every single-input task before every
  multi-input task, then by the first attempt's confidence class (`Confidence`), then by its thinking length, shortest
  first; `second_by_confidence = false` queues them first in, first out instead (the dense 44.03 run's plain queue:
  the confidence order came with a later MoE run). Promotion (the MoE runs): a single-input task whose first attempt
  ended naturally with a grid in fewer than `promote_below_thinking` thinking tokens, with no train-perfect program,
  gets its second attempt ahead of the unstarted first attempts; 0 turns it off, so every first attempt starts before
  any second (Algorithm 5, the dense run).
- L2: repair turns (caps `repair_caps`, one after another), only if no program of the task is train-perfect and a
  plain-view program (`PLAIN_VIEW`: attempt 1's or a repair turn's, not the reordered attempts') reproduces at least
  one demonstration (Algorithm 5 L2, seed ~2491; the MoE runs, ~4493-4495); started only `repair_min_left_s` before
  the hard stop. `repair_after` says when the first turn is queued: "first", when attempt 1 finishes (the MoE runs, study appendix A), or "both", once
  both attempts are in (Algorithm 5). A later turn is queued when the previous one finishes, under the same rule.
- L3: one extra attempt once both attempts are in, only if no program is train-perfect and the two grids differ;
  started only `extra_min_left_s` before the hard stop.
Every request's cap is min(level cap, rate * (hard_stop - now - cap_margin_s) - cap_margin_tokens); a request whose
cap falls under `min_cap` is dropped. No request starts after `time_limit_s - stop_new_margin_s`; the driver aborts
what is still running at the hard stop (`time_limit_s - hard_stop_margin_s`). At most `max_in_flight` run at once.
"""

from __future__ import annotations

import functools
import hashlib
import heapq
import itertools
from dataclasses import dataclass, field, replace
from enum import IntEnum

from submission.grids import Grid


REPAIR_AFTER = ("first", "both")  # ScheduleConfig.repair_after: after attempt 1, or after both attempts


class Level(IntEnum):
    FIRST = 0
    SECOND = 1
    REPAIR = 2
    EXTRA = 3


PLAIN_VIEW = (Level.FIRST, Level.REPAIR)  # levels prompted on the task as given (submission.reasoning.solve.view_for)


@dataclass(frozen=True)
class ScheduleConfig:
    """Every number of SPEC section 5, with the study's MoE defaults; profiles override them."""

    time_limit_s: float = 12 * 3600  # the competition's wall-clock limit L
    hard_stop_margin_s: float = 7 * 60  # the run ends (in-flight requests aborted) this long before L
    stop_new_margin_s: float = 15 * 60  # no request starts within this of L
    rate_tok_s: float = 8.0  # per-stream decode rate r used by the cap formula
    cap_margin_s: float = 240.0  # seconds kept free before the hard stop in the cap formula
    cap_margin_tokens: int = 3000  # tokens kept free (answer, program) in the cap formula
    min_cap: int = 4000  # a request whose cap falls below this is dropped
    cap_first_single: int = 96_000  # L0 cap for tasks with one test input
    cap_first_multi: int = 64_000  # L0 cap for tasks with several test inputs
    cap_second: int = 48_000  # L1 cap
    repair_caps: tuple[int, ...] = (24_000, 16_000)  # L2 caps, one repair turn each
    cap_extra: int = 32_000  # L3 cap
    promote_below_thinking: int = 40_000  # promotion threshold on the first attempt's thinking tokens; 0 = none
    repair_min_left_s: float = 30 * 60  # L2 starts only this long before the hard stop or earlier
    extra_min_left_s: float = 35 * 60  # L3 likewise
    max_in_flight: int = 56  # requests in flight; the engine's KV cache decides how many actually run
    second_by_confidence: bool = True  # L1 order: the study's (second_priority); false = first in, first out
    repair_after: str = "first"  # queue repair turn 1 when attempt 1 finishes ("first") or both are in ("both")

    def __post_init__(self) -> None:
        if self.repair_after not in REPAIR_AFTER:
            raise ValueError(f"schedule: repair_after must be one of {', '.join(REPAIR_AFTER)}, not "
                             f"{self.repair_after!r}")
        if self.promote_below_thinking < 0:
            raise ValueError(f"schedule: promote_below_thinking must be 0 (no promotion) or a number of thinking "
                             f"tokens, not {self.promote_below_thinking}")
        if self.hard_stop_margin_s > self.stop_new_margin_s:
            raise ValueError("schedule: hard_stop_margin_s must not exceed stop_new_margin_s")
        if self.rate_tok_s <= 0 or self.max_in_flight < 1 or self.min_cap < 1:
            raise ValueError("schedule: rate_tok_s, max_in_flight and min_cap must be positive")
        # A limit inside the margins would start no request at all (issue 12: a 240 s commit run under 7/15-minute
        # margins made zero attempts): refuse it with the numbers instead.
        needed = max(self.stop_new_margin_s, self.hard_stop_margin_s + self.cap_margin_s)
        if self.time_limit_s <= needed:
            raise ValueError(
                f"schedule: time_limit_s {self.time_limit_s:g} s leaves no time to start a request: it must exceed "
                f"stop_new_margin_s ({self.stop_new_margin_s:g} s) and hard_stop_margin_s + cap_margin_s "
                f"({self.hard_stop_margin_s:g} + {self.cap_margin_s:g} s); for a short run scale the schedule "
                f"(ScheduleConfig.scaled, submission.main --scale-schedule)")

    def scaled(self, time_limit_s: float) -> ScheduleConfig:
        """This schedule in miniature for a shorter time limit (the commit run's rehearsal): every time and token
        margin (`cap_margin_tokens` included), minimum time left, level cap, `min_cap` and the promotion threshold
        (unless 0: no promotion stays none) multiplied by time_limit_s / self.time_limit_s, so each level fits the
        short run as it fits the full one and every input the engine reaches in time gets a first attempt. An
        unscaled `cap_margin_tokens` (issue 27) cost a rehearsal 24 times its share: moe-4xL4 in 1,800 s could start
        no request once its engine was ready at 1,370 s, where the 12-hour run had hours left. The rate and the concurrency stay, and prompt lengths, the
        answer's length and engine start-up do not scale: a rehearsal is a miniature, not a forecast."""
        f = time_limit_s / self.time_limit_s

        def tokens(n: int) -> int:
            return max(1, round(n * f))

        return replace(
            self, time_limit_s=time_limit_s, hard_stop_margin_s=self.hard_stop_margin_s * f,
            stop_new_margin_s=self.stop_new_margin_s * f, cap_margin_s=self.cap_margin_s * f,
            cap_margin_tokens=round(self.cap_margin_tokens * f), min_cap=tokens(self.min_cap),
            cap_first_single=tokens(self.cap_first_single), cap_first_multi=tokens(self.cap_first_multi),
            cap_second=tokens(self.cap_second),
            repair_caps=tuple(tokens(c) for c in self.repair_caps), cap_extra=tokens(self.cap_extra),
            promote_below_thinking=tokens(self.promote_below_thinking) if self.promote_below_thinking else 0,
            repair_min_left_s=self.repair_min_left_s * f, extra_min_left_s=self.extra_min_left_s * f)

    @property
    def hard_stop(self) -> float:
        return self.time_limit_s - self.hard_stop_margin_s

    @property
    def stop_new(self) -> float:
        return self.time_limit_s - self.stop_new_margin_s

    def cap(self, level_cap: int, now: float) -> int:
        """The level cap shrunk so the request can finish before the hard stop at the per-stream rate."""
        return int(min(level_cap, self.rate_tok_s * (self.hard_stop - now - self.cap_margin_s) - self.cap_margin_tokens))


@dataclass(frozen=True)
class InputInfo:
    """What the schedule knows of a test input before any attempt: its size and its task's number of test inputs."""

    task_id: str
    test_index: int
    prompt_tokens: int
    task_inputs: int

    @property
    def key(self) -> tuple[str, int]:
        return self.task_id, self.test_index


@dataclass(frozen=True)
class Request:
    """One attempt to start now. `attempt` numbers an input's attempts from 1; `seed` is stable across runs."""

    task_id: str
    test_index: int
    attempt: int
    level: Level
    cap: int
    seed: int
    repair_turn: int = 0  # 1, 2, ... for L2 requests

    @property
    def key(self) -> tuple[str, int]:
        return self.task_id, self.test_index


@dataclass(frozen=True)
class Outcome:
    """What the schedule needs to know of a finished attempt (the full record lives in submission.attempts)."""

    task_id: str
    test_index: int
    attempt: int
    level: Level
    natural: bool  # thinking ended with </think> before the cap
    grid: Grid | None  # the direct answer grid (None: none parsed, or aborted)
    thinking_tokens: int
    train_perfect: bool  # the attempt's program reproduced every demonstration
    demos_right: int  # demonstrations its program reproduced

    @property
    def key(self) -> tuple[str, int]:
        return self.task_id, self.test_index


class Confidence(IntEnum):
    """The class of a first attempt that orders second attempts (SPEC 5: the study orders by "a confidence class of
    attempt 1" and names no classes; these are the kit's). Lower runs first: the order is the expected gain of a
    second attempt, not the first attempt's confidence itself.

    - NATURAL: thinking ended naturally with a grid and the task has no train-perfect program. Natural completions are
      right 42-86% of the time (SPEC 2), and the second attempt fills the second slot or outvotes the first grid; the
      study's own promotion rule (SPEC 5) gives exactly these the early second attempt.
    - VERIFIED: the task has a train-perfect program (of this attempt or another input's). Its output already ranks
      first and is right 73-78% of the time (SPEC 3): a second attempt adds little, but is usually short.
    - FORCED: a forced completion, or no grid. Forced answers are right ~8% of the time, and a task that used the whole
      first cap mostly uses the whole second cap too: the most tokens for the least gain.
    """

    NATURAL = 0
    VERIFIED = 1
    FORCED = 2


def confidence(first: Outcome, task_perfect: bool) -> Confidence:
    """The class of a finished first attempt; `task_perfect`: the task has a train-perfect program by now."""
    if task_perfect or first.train_perfect:
        return Confidence.VERIFIED
    if first.natural and first.grid is not None:
        return Confidence.NATURAL
    return Confidence.FORCED


def second_priority(first: Outcome, task_inputs: int, task_perfect: bool) -> tuple[int, int, int]:
    """The study's order of second attempts (smaller first): every single-input task before every multi-input task,
    then the first attempt's confidence class, then its thinking tokens (shorter thinking: an easier task, a cheaper
    second attempt, more second attempts done by the deadline)."""
    return int(task_inputs > 1), int(confidence(first, task_perfect)), first.thinking_tokens


@functools.lru_cache(maxsize=1 << 16)  # a simulated forecast asks for the same slots' seeds a thousand times
def stable_seed(task_id: str, test_index: int, attempt: int, tag: str = "") -> int:
    """A seed from (task, test input, attempt, tag) that is the same on every machine and Python version."""
    digest = hashlib.sha256(f"{task_id}/{test_index}/{attempt}/{tag}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


@dataclass
class _InputState:
    info: InputInfo
    finished: list[Outcome] = field(default_factory=list)
    attempts_issued: int = 0


@dataclass(frozen=True)
class Skip:
    """A queued attempt dropped because its cap fell below min_cap (reported by the driver's summary)."""

    task_id: str
    test_index: int
    level: Level
    cap: int


class Scheduler:
    """The queue with levels. Feed it `now` and finished outcomes; it hands out requests. No I/O, no clock."""

    def __init__(self, config: ScheduleConfig, inputs: list[InputInfo]):
        self.config = config
        self.inputs = {i.key: _InputState(i) for i in inputs}
        if len(self.inputs) != len(inputs):
            raise ValueError("schedule: duplicate test inputs")
        self._order = itertools.count()
        self._queue: list[tuple[tuple, tuple[str, int], Level, int]] = []  # (priority, key, level, repair turn)
        self._too_late: list[tuple[tuple, tuple[str, int], Level, int]] = []  # entries past their level's start
        self._too_late_at = 0.0  # when the last of them was set aside
        self.in_flight: dict[tuple[str, int, int], Request] = {}
        self.skipped: list[Skip] = []
        self.task_perfect: set[str] = set()  # tasks with a train-perfect program (found on any of their inputs)
        self._retried: set[tuple] = set()  # requests the engine failed once (retried once)
        for info in sorted(inputs, key=lambda i: (i.prompt_tokens, i.task_id, i.test_index)):
            self._push((int(Level.FIRST), 1, next(self._order)), info.key, Level.FIRST)

    def _push(self, priority: tuple, key: tuple[str, int], level: Level, turn: int = 0) -> None:
        heapq.heappush(self._queue, (priority, key, level, turn))

    def _level_cap(self, state: _InputState, level: Level, turn: int) -> int:
        c = self.config
        if level is Level.FIRST:
            return c.cap_first_single if state.info.task_inputs == 1 else c.cap_first_multi
        if level is Level.SECOND:
            return c.cap_second
        if level is Level.REPAIR:
            return c.repair_caps[turn - 1]
        return c.cap_extra

    def _allowed(self, level: Level, now: float) -> bool:
        left = self.config.hard_stop - now
        if level is Level.REPAIR:
            return left >= self.config.repair_min_left_s
        if level is Level.EXTRA:
            return left >= self.config.extra_min_left_s
        return True

    def next(self, now: float) -> Request | None:
        """The request to start at `now`, or None: the in-flight bound is reached, the queue is empty, or it is too
        late. Call it repeatedly until None after every event. None with nothing in flight means the run is over:
        time only moves on, caps only shrink and late levels only become less allowed."""
        if now > self.config.stop_new or len(self.in_flight) >= self.config.max_in_flight:
            return None
        if self._too_late and now < self._too_late_at:  # called at an earlier time: they may be allowed again
            for entry in self._too_late:
                heapq.heappush(self._queue, entry)
            self._too_late.clear()
        request = None
        while self._queue:
            entry = heapq.heappop(self._queue)
            _, key, level, turn = entry
            if not self._allowed(level, now):
                # Too late for this level now, and it only gets later: set aside (kept for the record), not popped
                # again by every later call as when it was pushed back (the simulator's costliest line, issue 16).
                self._too_late.append(entry)
                self._too_late_at = now
                continue
            state = self.inputs[key]
            cap = self.config.cap(self._level_cap(state, level, turn), now)
            if cap < self.config.min_cap:
                self.skipped.append(Skip(key[0], key[1], level, cap))
                continue
            state.attempts_issued += 1
            attempt = state.attempts_issued
            request = Request(key[0], key[1], attempt, level, cap, stable_seed(key[0], key[1], attempt), turn)
            self.in_flight[(key[0], key[1], attempt)] = request
            break
        return request

    def on_finished(self, now: float, outcome: Outcome) -> None:
        """Record a finished attempt and queue what it makes possible."""
        request = self.in_flight.pop((outcome.task_id, outcome.test_index, outcome.attempt))
        state = self.inputs[outcome.key]
        state.finished.append(outcome)
        if outcome.train_perfect:
            self.task_perfect.add(outcome.task_id)
        levels = [o.level for o in state.finished]
        if request.level is Level.FIRST:
            self._push(self._second_priority(state, outcome), outcome.key, Level.SECOND)
            if self.config.repair_after == "first":
                self._queue_repair(state, turn=1)
        if request.level in (Level.FIRST, Level.SECOND) and Level.FIRST in levels and Level.SECOND in levels:
            if self.config.repair_after == "both":  # both attempts are in
                self._queue_repair(state, turn=1)
            self._queue_extra(state)
        elif request.level is Level.REPAIR:
            self._queue_repair(state, turn=request.repair_turn + 1)

    def _second_priority(self, state: _InputState, first: Outcome) -> tuple:
        promote = (self.config.promote_below_thinking > 0 and state.info.task_inputs == 1 and first.natural
                   and first.grid is not None and first.thinking_tokens < self.config.promote_below_thinking
                   and first.task_id not in self.task_perfect)
        # Promoted second attempts sort before every unstarted first attempt (level 0, rank 0 < 1).
        if promote:
            return int(Level.FIRST), 0, next(self._order)
        order = second_priority(first, state.info.task_inputs, first.task_id in self.task_perfect) \
            if self.config.second_by_confidence else ()
        return (int(Level.SECOND), 0) + order + (next(self._order),)

    def _queue_repair(self, state: _InputState, turn: int) -> None:
        """Queue repair turn `turn` if there is one and no program of the task is train-perfect, but a plain-view
        program of this input reproduces a demonstration."""
        if turn > len(self.config.repair_caps) or state.info.task_id in self.task_perfect:
            return
        if max((o.demos_right for o in state.finished if o.level in PLAIN_VIEW), default=0) >= 1:
            self._push((int(Level.REPAIR), 0, next(self._order)), state.info.key, Level.REPAIR, turn)

    def _queue_extra(self, state: _InputState) -> None:
        """Queue the extra attempt (once both attempts are in) if no program of the task is train-perfect and the two
        attempts' grids differ."""
        if state.info.task_id in self.task_perfect:
            return
        grids = {o.grid for o in state.finished if o.level in (Level.FIRST, Level.SECOND)}
        if len(grids) == 2 and None not in grids:
            self._push((int(Level.EXTRA), 0, next(self._order)), state.info.key, Level.EXTRA)

    def on_failed(self, now: float, request: Request) -> bool:
        """An attempt the engine failed (no completion). The first time, it goes back to the head of its level and
        True is returned; a second failure of the same request counts as a finished attempt without an answer
        (False), so one request that always breaks the engine cannot stall its input."""
        self.in_flight.pop((request.task_id, request.test_index, request.attempt))
        ident = (request.key, request.level, request.repair_turn)
        if ident not in self._retried:
            self._retried.add(ident)
            self._push((int(request.level), -1, next(self._order)), request.key, request.level, request.repair_turn)
            return True
        self.in_flight[(request.task_id, request.test_index, request.attempt)] = request
        self.on_finished(now, Outcome(request.task_id, request.test_index, request.attempt, request.level, False,
                                      None, 0, False, 0))
        return False

    def restore(self, outcome: Outcome) -> None:
        """Replay a finished attempt from an earlier run's log (`--resume`) as if it had just run: its queue entry is
        taken and what it makes possible is queued, so nothing finished is redone."""
        state = self.inputs[outcome.key]
        turn = 1 + sum(o.level is Level.REPAIR for o in state.finished) if outcome.level is Level.REPAIR else 0
        for i, (_, key, level, entry_turn) in enumerate(self._queue):
            if key == outcome.key and level is outcome.level and entry_turn == turn:
                self._queue.pop(i)
                heapq.heapify(self._queue)
                break
        state.attempts_issued = max(state.attempts_issued, outcome.attempt)
        self.in_flight[(outcome.task_id, outcome.test_index, outcome.attempt)] = Request(
            outcome.task_id, outcome.test_index, outcome.attempt, outcome.level, 0, 0, turn)
        self.on_finished(0.0, outcome)

    def abort_all(self) -> list[Request]:
        """At the hard stop: everything in flight, for the driver to abort (their outcomes are not needed)."""
        aborted = list(self.in_flight.values())
        self.in_flight.clear()
        return aborted

    def pending(self) -> int:
        """Queued attempts never started: still queued, or too late for their level."""
        return len(self._queue) + len(self._too_late)
