"""The engine interface: one small async API that the solver drives, whatever generates the tokens.

An engine takes one request per attempt (prompt token ids, thinking cap, seed) and runs all of its phases itself:
THINK up to the cap, the forced-close sentence and `</think>` at the cap, the answer grammar at the answer temperature
(submission.reasoning.reply_grammar; a tool agent's turns, `reply`, admit its `check_transform` call), end of turn. It
returns a `Completion` with token counts and times; `abort` stops a request; `stats` gives per-window throughput (tokens
generated, running requests, and the engine's own counts of drafts, accepted drafts and preemptions where it has
them: submission.engine_numbers), which `sim calibrate` fits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Protocol

from submission.reasoning.reply_grammar import Reply


@dataclass(frozen=True)
class GenerationRequest:
    request_id: str  # "task_id/test_index/attempt": unique in a run, readable in logs
    prompt_ids: tuple[int, ...]
    thinking_cap: int
    seed: int
    reply: Reply = Reply.ANSWER  # what the grammar after `</think>` admits (a tool agent's turns: a call)


@dataclass(frozen=True)
class Completion:
    request_id: str
    text: str  # everything generated: thinking, the forced close if any, `</think>`, the answer
    thinking_tokens: int  # tokens before `</think>` (the forced sentence counts as thinking)
    answer_tokens: int  # tokens after `</think>`
    natural: bool  # the model closed its thinking itself
    finish: str  # "stop" (end of turn), "length" (answer limit), "aborted", "error: ..."
    started: float  # time.monotonic() at submission and at the end
    finished: float
    token_ids: tuple[int, ...] = ()  # the generated ids, as sampled (training keeps them exactly)


@dataclass(frozen=True)
class StatsWindow:
    start: float  # time.monotonic() of the window's start
    seconds: float
    tokens: int  # tokens generated in the window, all requests
    running: float  # mean number of running requests in the window
    prompt_tokens: int = 0  # prompt tokens prefilled in the window
    context: float = 0.0  # mean context tokens held by the running requests (KV cache in use)
    # vLLM's own counts (SpecDecodingStats, IterationStats); 0 for an engine without them: requests' steps that
    # verified drafts, draft tokens proposed, draft tokens accepted, requests preempted
    drafts: int = 0
    draft_tokens: int = 0
    accepted_drafts: int = 0
    preemptions: int = 0


COUNTS = ("drafts", "draft_tokens", "accepted_drafts", "preemptions")  # StatsWindow's counts from the engine itself


@dataclass
class ThroughputMeter:
    """Accumulates generated tokens and running requests into fixed windows (engines call `add`)."""

    window_s: float = 10.0
    windows: list[StatsWindow] = field(default_factory=list)
    generated: int = 0  # every token generated so far, the window in progress included (the solver's heartbeat)
    # the same for the engine's own counts (StatsWindow), and the request-seconds spent running (tokens / this: the
    # decode rate a running request got)
    drafts: int = 0
    draft_tokens: int = 0
    accepted_drafts: int = 0
    preemptions: int = 0
    request_seconds: float = 0.0
    _start: float = field(default_factory=time.monotonic)
    _tokens: int = 0
    _prompt: int = 0
    _running_area: float = 0.0
    _context_area: float = 0.0
    _last: float = field(default_factory=time.monotonic)
    _running: int = 0
    _context: float = 0.0
    _counts: dict = field(default_factory=lambda: dict.fromkeys(COUNTS, 0))

    def add(self, tokens: int = 0, running: int | None = None, prompt_tokens: int = 0,
            context: float | None = None, now: float | None = None, drafts: int = 0, draft_tokens: int = 0,
            accepted_drafts: int = 0, preemptions: int = 0) -> None:
        now = time.monotonic() if now is None else now
        while now >= self._start + self.window_s:
            self._end_window(self._start + self.window_s)
        self.request_seconds += self._running * (now - self._last)
        self._running_area += self._running * (now - self._last)
        self._context_area += self._context * (now - self._last)
        self._last = now
        self._tokens += tokens
        self.generated += tokens
        self._prompt += prompt_tokens
        for name, value in zip(COUNTS, (drafts, draft_tokens, accepted_drafts, preemptions)):
            self._counts[name] += value
            setattr(self, name, getattr(self, name) + value)
        if running is not None:
            self._running = running
        if context is not None:
            self._context = context

    def close(self, now: float | None = None) -> None:
        """End the window in progress at `now` as a shorter one, so the statistics hold a run's last tokens too."""
        now = time.monotonic() if now is None else now
        self.add(now=now)  # the whole windows before `now`
        if now > self._start and (self._tokens or self._prompt or self._running_area or any(self._counts.values())):
            self._end_window(now)

    def _end_window(self, end: float) -> None:
        """Append the window from its start to `end` (the running and context areas counted up to `end`)."""
        self.request_seconds += self._running * (end - self._last)
        self._running_area += self._running * (end - self._last)
        self._context_area += self._context * (end - self._last)
        seconds = end - self._start
        self.windows.append(StatsWindow(self._start, seconds, self._tokens, self._running_area / seconds,
                                        self._prompt, self._context_area / seconds, **self._counts))
        self._start, self._last, self._tokens, self._prompt = end, end, 0, 0
        self._counts = dict.fromkeys(COUNTS, 0)
        self._running_area = self._context_area = 0.0


class EngineDead(RuntimeError):
    """The engine as a whole is gone (a crashed vLLM core, a dead worker thread): the solver restarts it once."""


class Engine(Protocol):
    meter: ThroughputMeter

    async def start(self) -> None: ...

    async def generate(self, request: GenerationRequest) -> Completion: ...

    async def abort(self, request_id: str) -> None: ...

    async def close(self) -> None: ...
