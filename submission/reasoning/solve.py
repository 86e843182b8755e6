"""One attempt end to end, and the candidates it adds: render, generate, parse, check, record.

`Attempts.run` is the whole life of one scheduled attempt against an engine and the sandbox: one request, or the
tool agent's turns for a first attempt when the profile turns it on (submission.reasoning.tool_agent: the first turn
calls `check_transform`, later turns call or answer; its result is Algorithm 7 lines 16-17: `agent_result`,
`needs_direct`). The answers its records lead to are submission.selection's `Candidates`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Callable

from submission import engine_numbers
from submission.reasoning.reply_grammar import ParsedAnswer, Reply, parse_answer
from submission.attempts import AttemptRecord
from submission.reasoning.profile import Profile
from submission.reasoning.engines.base import Completion, Engine, GenerationRequest
from submission.grids import Grid
from submission.reasoning.prompt import FIX, check_text, repair_text
from submission.sandbox.client import CheckResult, Sandbox, Status
from submission.schedule import PLAIN_VIEW, Level, Request
from submission.tasks import Task
from submission.reasoning.tool_agent import (LAST_CHECK, NO_CALL, finished, first_cap, instructions, next_turn,
                                             request_limit, within_tokens)
from submission.views import View, reordered

# render(task, test_index, view, extra) -> prompt token ids
Renderer = Callable[[Task, int, View, str], list[int]]
# tool_turn(text) -> the ids that follow an assistant turn when a tool answers with `text`
# (submission.reasoning.prompt.tool_turn)
ToolTurn = Callable[[str], list[int]]


def estimated_ids(text: str) -> list[int]:
    """Length-only stand-in for token ids where there is no tokenizer (the replay engine): 3 characters a token."""
    return [0] * (len(text) // 3)


def view_for(level: Level, n_train: int) -> View:
    """Plain for first attempts and repairs, demonstrations rotated by one for the second, reversed for the extra."""
    if level is Level.SECOND and n_train > 1:
        return reordered(n_train, 1)
    if level is Level.EXTRA and n_train > 1:
        return View(order=tuple(reversed(range(n_train))))
    return View()


def request_id(request: Request) -> str:
    return f"{request.task_id}/{request.test_index}/{request.attempt}"


@dataclass(frozen=True)
class Turn:
    """One request of an attempt: what the engine returned and what the sandbox said of its program."""

    completion: Completion
    grid: Grid | None  # in the task's own orientation
    parse_error: str | None
    program: str | None
    check: CheckResult | None
    call: bool = False  # a readable `check_transform` call (its code block closed), not an answer

    @property
    def failed(self) -> bool:
        return self.completion.finish == "aborted" or self.completion.finish.startswith("error")


@dataclass
class Attempts:
    """Runs attempts: everything one request needs, and the best plain-view program of each input for repair turns."""

    profile: Profile
    tasks: dict[str, Task]
    engine: Engine
    sandbox: Sandbox
    render: Renderer
    clock: Callable[[], float]  # seconds since the run started
    tool_turn: ToolTurn = estimated_ids
    best: dict[tuple[str, int], tuple[int, str]] = field(default_factory=dict)  # plain view: demos right, program

    def note_program(self, record: AttemptRecord) -> None:
        """Keep the input's best plain-view program (PLAIN_VIEW: the one a repair turn is queued for, Algorithm 5 L2,
        seed ~2491), the one with the most demonstrations right."""
        key = (record.task_id, record.test_index)
        if record.level not in PLAIN_VIEW:
            return
        if record.program and record.demos_right > self.best.get(key, (-1, ""))[0]:
            self.best[key] = (record.demos_right, record.program)

    async def _repair_extra(self, task: Task, key: tuple[str, int]) -> str:
        if key not in self.best:
            return ""
        program = self.best[key][1]
        check = await asyncio.to_thread(self.sandbox.check, program, task)
        return repair_text(program, demo_results(task, check))

    async def _turn(self, request: Request, view: View, prompt: list[int], cap: int,
                    reply: Reply = Reply.ANSWER) -> Turn:
        completion = await self.engine.generate(
            GenerationRequest(request_id(request), tuple(prompt), cap, request.seed, reply))
        parsed = parse_answer(completion.text)
        if reply is Reply.CALL and not parsed.call:
            parsed = as_call(parsed)
        grid = view.invert_grid(parsed.grid) if parsed.grid is not None else None
        readable = not parsed.call or parsed.closed  # a call cut by the answer limit is not run
        check = None
        if parsed.program is not None and readable:
            check = await asyncio.to_thread(self.sandbox.check, parsed.program, self.tasks[request.task_id])
        return Turn(completion, grid, parsed.error if grid is None else None, parsed.program if readable else None,
                    check, parsed.call and readable)

    async def _agent(self, request: Request, view: View, prompt: list[int]) -> tuple[list[Turn], int]:
        """The tool agent's turns (submission.reasoning.tool_agent): the first turn calls `check_transform`, later ones
        call or answer; a call is run on the demonstrations and its results continue the conversation. Also returns the
        tool turns' tokens."""
        config, reserve = self.profile.tool_agent, self.profile.engine.answer_max_tokens
        task = self.tasks[request.task_id]
        single = len(task.test_inputs) == 1
        cap, used, checks, final, turns = min(request.cap, first_cap(config, single)), 0, 0, False, []
        tool_tokens = 0
        while True:
            turn = await self._turn(request, view, prompt, cap, turn_reply(len(turns), final))
            turns.append(turn)
            used += turn.completion.thinking_tokens + turn.completion.answer_tokens
            if turn.failed or final or turn.grid is not None:
                break  # the engine failed, the final turn ended, or the model answered (not on the first turn)
            checks += 1  # a call; one whose program cannot be read counts as a check too (SPEC 5)
            check = turn.check if turn.call else None
            test = check.test[request.test_index] if check is not None else None
            verified = test is not None and finished(check.train_perfect, test.output)
            closing = LAST_CHECK if verified or checks >= config.checks else FIX
            texts = [NO_CALL] if test is None else [
                check_text(demo_results(task, check), test.output, test.message or test.status.value,
                           config.failing_pairs, config.max_cells, config.test_output_max_cells, grids, closing)
                for grids in (True, False)]
            tool_ids = within_tokens(texts, self.tool_turn, config.feedback_max_tokens)
            used += len(tool_ids)
            tool_tokens += len(tool_ids)
            prompt = continued(prompt, turn.completion.token_ids, tool_ids)
            # The deadline-aware cap and the context cut what the attempt may still spend (SPEC 5: the cap formula
            # cuts the agent's budget); when they leave not one thinking token for a request, the attempt ends. A
            # spent budget does not end it: the final turn then closes at once (cap 0) and answers.
            limit = request_limit(self.profile.schedule.cap(config.budget_single + config.budget_multi, self.clock()),
                                  self.profile.engine.max_model_len, len(prompt), reserve)
            if limit < 1:
                break
            cap, final = next_turn(config, checks, used, single, limit, verified)
        return turns, tool_tokens

    async def run(self, request: Request) -> AttemptRecord:
        task = self.tasks[request.task_id]
        view = view_for(request.level, len(task.train))
        extra = await self._repair_extra(task, request.key) if request.level is Level.REPAIR else ""
        prompt = self.render(task, request.test_index, view, extra)
        started, engine_before = self.clock(), engine_numbers.from_meters([self.engine.meter])
        agent = request.level is Level.FIRST and self.profile.tool_agent.enabled
        if agent:
            tool = instructions(self.profile.tool_agent.checks)
            turns, tool_tokens = await self._agent(request, view,
                                                   self.render(task, request.test_index, view, extra + tool))
            if needs_direct(turns):  # Algorithm 7 line 17: the direct attempt instead
                cap = self.profile.schedule.cap(request.cap, self.clock())
                if cap >= self.profile.schedule.min_cap:
                    turns.append(await self._turn(request, view, prompt, cap))
        else:
            turns, tool_tokens = [await self._turn(request, view, prompt, request.cap)], 0
        # The grid is the last turn's, unless it failed (aborted, engine error) after one that did not.
        final = next((t for t in reversed(turns) if not t.failed), turns[-1])
        candidates, weak = agent_result(turns, request.test_index) if agent else ([], ())
        # The record's program: the first candidate, else the checked program with the most demonstrations right
        # (what a repair turn starts from; the latest of equals), else the answer's.
        checked = [t for t in turns if not t.failed and t.check is not None]
        best = max(reversed(checked), key=lambda t: demos_right(t.check), default=final)
        source = candidates[0] if candidates else best
        check = source.check
        record = AttemptRecord(
            task_id=request.task_id, test_index=request.test_index, attempt=request.attempt, level=request.level,
            seed=request.seed, cap=request.cap, view=view.to_json(), natural=turns[0].completion.natural,
            thinking_tokens=sum(t.completion.thinking_tokens for t in turns),
            answer_tokens=sum(t.completion.answer_tokens for t in turns), prompt_tokens=len(prompt),
            grid=final.grid, parse_error=final.parse_error, program=source.program,
            train_perfect=check is not None and check.train_perfect,
            demos_right=demos_right(check) if check else 0,
            program_outputs=check.test_outputs if check else (),
            candidate_outputs=tuple(t.check.test_outputs for t in candidates), weak_outputs=weak,
            started_s=started, finished_s=self.clock(),
            aborted=final.failed, finish=final.completion.finish, turns=len(turns),
            turn_tokens=tuple(t.completion.thinking_tokens + t.completion.answer_tokens for t in turns)
            if len(turns) > 1 else (), tool_tokens=tool_tokens,
            engine=engine_numbers.to_json(engine_numbers.since(engine_before,
                                                               engine_numbers.from_meters([self.engine.meter]))))
        self.note_program(record)
        return record


def turn_reply(turn: int, final: bool) -> Reply:
    """What the agent's turn may write (Algorithm 7 line 4, seed ~3443): the first turn a `check_transform` call,
    later turns a call or the final answer, the final turn (line 14) the answer."""
    return Reply.ANSWER if final else Reply.CALL if turn == 0 else Reply.EITHER


def as_call(parsed: ParsedAnswer) -> ParsedAnswer:
    """A first turn that answered although its grammar admits only a call (an engine without the grammar: a replayed
    or scripted completion). The study's first turn emits a call and allows the final grid only from the second turn
    on (Algorithm 7 line 4), so the answer is not accepted: its grid is dropped and its program is read as the call
    (checked, shown to the model, a check counted; none: the unreadable call's note), and the loop goes on."""
    return ParsedAnswer(None, parsed.program, "an answer on the first turn, read as its call (Algorithm 7 line 4)",
                        call=True, closed=parsed.closed)


def needs_direct(turns: list[Turn]) -> bool:
    """Algorithm 7 line 17 (seed ~3470): the direct attempt replaces the agent only on an infrastructure error (an
    engine error; not the hard stop's abort) that left neither a grid nor a checked program."""
    return (turns[-1].completion.finish.startswith("error")
            and all(t.grid is None and t.check is None for t in turns if not t.failed))


def agent_result(turns: list[Turn], test_index: int) -> tuple[list[Turn], tuple[Grid, ...]]:
    """Algorithm 7 line 16 (seed ~3466-3468): the turns whose programs are program candidates (checked programs that
    the checker finds train-perfect, in check order, then the final program if it passes: the turns' order) and the
    weak pool (this input's test output of every other program that ran with one). The kit's sandbox is both the
    tool checker and the production checker. A program already taken (the final answer repeating a checked call) is
    not taken twice: one program, one vote."""
    candidates, weak, seen = [], [], set()
    for turn in turns:
        if turn.failed or turn.check is None or turn.program in seen:
            continue
        seen.add(turn.program)
        output = turn.check.test_outputs[test_index] if test_index < len(turn.check.test_outputs) else None
        if turn.check.train_perfect:
            candidates.append(turn)
        elif output is not None:
            weak.append(output)
    return candidates, tuple(weak)


def continued(prompt: list[int], sampled: tuple[int, ...], tool_ids: list[int]) -> list[int]:
    """The next turn's prompt: the conversation so far, the ids as sampled and the tool turn (whose ids start with the
    end-of-turn marker the model sampled last: it is kept once)."""
    sampled_ids = list(sampled)
    if sampled_ids and tool_ids and sampled_ids[-1] == tool_ids[0]:
        sampled_ids.pop()
    return prompt + sampled_ids + tool_ids


def demos_right(check: CheckResult) -> int:
    return sum(p.status is Status.RIGHT for p in check.train)


def demo_results(task: Task, check: CheckResult) -> list[tuple[Grid, Grid | None, str]]:
    """(expected, produced, status or error) per demonstration, for the repair turn and the tool turn."""
    return [(p.output, r.output, r.message or r.status.value) for p, r in zip(task.train, check.train)]
