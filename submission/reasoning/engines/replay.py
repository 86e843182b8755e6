"""The `replay` engine: serves logged attempts instead of generating, for the simulator and the solver's tests.

A request "task/test/attempt" gets the logged record of the same input and attempt number, else of the same input
(attempts in order, cycling), else one drawn from the whole pool with the request's seed. Its completion text is
rebuilt so that the ordinary parser yields the logged grid and program, and it arrives after the logged duration
times `time_scale` (0 = at once). Thinking beyond the request's cap is cut to the cap and becomes a forced completion
whose grid is dropped (SPEC: forced completions are rarely right; the simulator refines this rule).
"""

from __future__ import annotations

import asyncio
import random
import time

from submission.reasoning.reply_grammar import FENCE, THINK_END
from submission.attempts import AttemptRecord
from submission.reasoning.profile import EngineConfig
from submission.reasoning.engines.base import Completion, GenerationRequest, ThroughputMeter
from submission.reasoning.prompt import grid_text


class ReplayEngine:
    def __init__(self, records: list[AttemptRecord], config: EngineConfig, time_scale: float = 1.0):
        if not records:
            raise ValueError("replay engine: the log holds no attempts")
        self.config = config
        self.time_scale = time_scale
        self.meter = ThroughputMeter(config.stats_window_s)
        self.pool = records
        self.by_input: dict[tuple[str, int], list[AttemptRecord]] = {}
        for record in records:
            self.by_input.setdefault((record.task_id, record.test_index), []).append(record)
        self._aborted: set[str] = set()
        self.running = 0

    async def start(self) -> None:
        return None

    def pick(self, request: GenerationRequest) -> AttemptRecord:
        task_id, test_index, attempt = request.request_id.rsplit("/", 2)
        logged = self.by_input.get((task_id, int(test_index)))
        if logged:
            same = [r for r in logged if r.attempt == int(attempt)]
            return same[0] if same else logged[(int(attempt) - 1) % len(logged)]
        return random.Random(request.seed).choice(self.pool)

    def completion_text(self, record: AttemptRecord, forced: bool) -> str:
        text = THINK_END + "\n"
        if record.grid is not None and not forced:
            text += grid_text(record.grid) + "\n"
        if record.program:
            body = record.program.split("def transform(grid):", 1)[-1]
            text += self.config.program_cue + body + FENCE
        return text

    async def generate(self, request: GenerationRequest) -> Completion:
        started = time.monotonic()
        record = self.pick(request)
        forced = record.thinking_tokens > request.thinking_cap
        thinking = min(record.thinking_tokens, request.thinking_cap)
        duration = max(record.finished_s - record.started_s, 0.0) * self.time_scale
        if forced and record.thinking_tokens:
            duration *= thinking / record.thinking_tokens
        self.running += 1
        self.meter.add(running=self.running)
        try:
            deadline = started + duration
            while time.monotonic() < deadline and request.request_id not in self._aborted:
                await asyncio.sleep(min(0.05, max(deadline - time.monotonic(), 0)))
        finally:
            self.running -= 1
            self.meter.add(tokens=thinking + record.answer_tokens, running=self.running)
        if request.request_id in self._aborted:
            self._aborted.discard(request.request_id)
            return Completion(request.request_id, "", thinking, 0, False, "aborted", started, time.monotonic())
        return Completion(request.request_id, self.completion_text(record, forced), thinking, record.answer_tokens,
                          record.natural and not forced, "stop", started, time.monotonic())

    async def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)

    async def close(self) -> None:
        return None
