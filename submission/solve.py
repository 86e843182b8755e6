"""One attempt end to end, and the candidates it adds: render, generate, parse, check, record.

`Attempts.run` is the whole life of one scheduled request against an engine and the sandbox; `Candidates` is the pure
state that turns finished attempts into the two answers per test input (SPEC sections 3 and 4, with program transfer
to the task's other test inputs).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable

from submission.answer import parse_answer
from submission.attempts import AttemptRecord
from submission.config import Profile
from submission.engines.base import Engine, GenerationRequest
from submission.grids import Grid
from submission.prompt import repair_text
from submission.sandbox import CheckResult, Sandbox, Status
from submission.schedule import Level, Request
from submission.selection import Candidate, Source, select
from submission.tasks import Task
from submission.views import View, reordered

# render(task, test_index, view, extra) -> prompt token ids
Renderer = Callable[[Task, int, View, str], list[int]]


def view_for(level: Level, n_train: int) -> View:
    """Plain for first attempts and repairs, demonstrations rotated by one for the second, reversed for the extra."""
    if level is Level.SECOND and n_train > 1:
        return reordered(n_train, 1)
    if level is Level.EXTRA and n_train > 1:
        return View(order=tuple(reversed(range(n_train))))
    return View()


def request_id(request: Request) -> str:
    return f"{request.task_id}/{request.test_index}/{request.attempt}"


@dataclass
class Candidates:
    """Candidates per test input from finished attempts; `answers(key)` applies SPEC section 4. Pure state, shared
    by the solver and the simulator."""

    by_input: dict[tuple[str, int], list[Candidate]] = field(default_factory=dict)

    def add(self, task_id: str, test_index: int, attempt: int, grid: Grid | None, train_perfect: bool,
            program_outputs: tuple) -> list[tuple[str, int]]:
        """Add an attempt's grid and, if its program is train-perfect, its outputs (transferred to the task's other
        test inputs). Returns the inputs whose candidates changed."""
        changed = []
        if grid is not None:
            self.by_input.setdefault((task_id, test_index), []).append(Candidate(grid, Source.GRID, attempt))
            changed.append((task_id, test_index))
        if train_perfect:
            for index, output in enumerate(program_outputs):
                if output is None:
                    continue
                source = Source.PROGRAM if index == test_index else Source.TRANSFERRED
                self.by_input.setdefault((task_id, index), []).append(Candidate(output, source, attempt))
                changed.append((task_id, index))
        return sorted(set(changed))

    def add_record(self, record: AttemptRecord) -> list[tuple[str, int]]:
        return self.add(record.task_id, record.test_index, record.attempt, record.grid, record.train_perfect,
                        record.program_outputs)

    def answers(self, key: tuple[str, int]) -> tuple[Grid, Grid]:
        return select(self.by_input.get(key, []))


@dataclass
class Attempts:
    """Runs attempts: everything one request needs, and the best program of each input for repair turns."""

    profile: Profile
    tasks: dict[str, Task]
    engine: Engine
    sandbox: Sandbox
    render: Renderer
    clock: Callable[[], float]  # seconds since the run started
    best: dict[tuple[str, int], tuple[int, str]] = field(default_factory=dict)  # demos right, program

    def note_program(self, record: AttemptRecord) -> None:
        key = (record.task_id, record.test_index)
        if record.program and record.demos_right > self.best.get(key, (-1, ""))[0]:
            self.best[key] = (record.demos_right, record.program)

    async def _repair_extra(self, task: Task, key: tuple[str, int]) -> str:
        if key not in self.best:
            return ""
        program = self.best[key][1]
        check = await asyncio.to_thread(self.sandbox.check, program, task)
        demos = [(p.output, r.output, r.message or r.status.value) for p, r in zip(task.train, check.train)]
        return repair_text(program, demos)

    async def run(self, request: Request) -> AttemptRecord:
        task = self.tasks[request.task_id]
        view = view_for(request.level, len(task.train))
        extra = await self._repair_extra(task, request.key) if request.level is Level.REPAIR else ""
        prompt = self.render(task, request.test_index, view, extra)
        started = self.clock()
        completion = await self.engine.generate(
            GenerationRequest(request_id(request), tuple(prompt), request.cap, request.seed))
        parsed = parse_answer(completion.text)
        grid = view.invert_grid(parsed.grid) if parsed.grid is not None else None
        check: CheckResult | None = None
        if parsed.program is not None:
            check = await asyncio.to_thread(self.sandbox.check, parsed.program, task)
        record = AttemptRecord(
            task_id=request.task_id, test_index=request.test_index, attempt=request.attempt, level=request.level,
            seed=request.seed, cap=request.cap, view=view.to_json(), natural=completion.natural,
            thinking_tokens=completion.thinking_tokens, answer_tokens=completion.answer_tokens,
            prompt_tokens=len(prompt), grid=grid,
            parse_error=parsed.error if grid is None else None, program=parsed.program,
            train_perfect=check is not None and check.train_perfect,
            demos_right=sum(p.status is Status.RIGHT for p in check.train) if check else 0,
            program_outputs=check.test_outputs if check else (), started_s=started, finished_s=self.clock(),
            aborted=completion.finish == "aborted" or completion.finish.startswith("error"),
            finish=completion.finish)
        self.note_program(record)
        return record
