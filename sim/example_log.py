"""Make an attempt log from a parameterised model of thinking lengths and accuracy: the example `make simulate` ships
with, or a team's "what if" (longer thinking, fewer natural completions) without code. It is synthetic, and says so.

    python -m sim.example_log --tasks ARC_DATA/arc-agi-2/evaluation --out sim/data/example_attempts.jsonl
        [--seed 0] [--cap 96000] [--thinking-easy 20000] [--thinking-hard 70000] [--thinking-sigma 0.6]
        [--natural-rate R] [--accuracy-by-length 16000:1.6,48000:1.0,96000:0.5] [--forced-accuracy 0.08]
        [--program-rate 0.3] [--program-accuracy 0.75] [--attempts 3] [--inputs-per-task 1:0.6,2:0.3,3:0.1]

No real 12-hour run of a 27B or MoE model can be made here, so the example is generated from the numbers SPEC states
(a published study): forced completions are right about 8% of the time and natural ones 42-86%; train-perfect
programs are right 73-78% of the time. Per task a difficulty d ~ Beta(0.7, 0.9) sets the chance that a natural answer
is right (d) and the median thinking length (easy + (hard - easy) x (1 - d) tokens, lognormal with sigma
`thinking_sigma`); thinking beyond the logged cap was forced. Options:
- `natural_rate`: instead, each attempt completes naturally with this chance (its thinking then kept below the cap),
  else it is forced at the cap.
- `accuracy_by_length` ("UPTO:FACTOR,..."): a natural answer of t thinking tokens is right with chance
  min(1, FACTOR(t) x d / E[d]) (E[d] = 0.4375), FACTOR of the first bin whose upper bound holds t (the last beyond);
  long thinking that is less often right, as the study saw.
- a natural right answer comes with a train-perfect program with chance `program_rate`, right with chance
  `program_accuracy`.
- `inputs_per_task` ("COUNT:WEIGHT,..."): log only a subset of the tasks, chosen (seeded) so that their test-input
  counts follow the weights, as many tasks as the rarest asked count allows. A log is keyed by real test inputs with
  real labels, so a task's count cannot change: the mix is reached by leaving tasks out. In a forecast the tasks left
  out still run, drawing attempts from the pool like made-up ones; the pool they and made-up tasks draw from then has
  the asked mix (the forecast's own `--inputs-per-task` sets the made-up tasks' counts).
Durations follow 8 tokens/s per stream. Grids are the real labels when right, else a wrong grid. The defaults make
the shipped example. Use your own run's log (`submission.main --log`) for forecasts that matter.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path

from sim.scenario import parse_counts
from submission.attempts import AttemptRecord
from submission.schedule import Level
from submission.tasks import load_tasks

RATE = 8.0
MEAN_DIFFICULTY = 0.7 / (0.7 + 0.9)
LEVELS = ((1, Level.FIRST), (2, Level.SECOND), (3, Level.EXTRA), (4, Level.EXTRA))


@dataclass(frozen=True)
class LogShape:
    cap: int = 96_000
    thinking_easy: float = 20_000
    thinking_hard: float = 70_000
    thinking_sigma: float = 0.6
    natural_rate: float | None = None
    accuracy_by_length: tuple[tuple[int, float], ...] = ()
    forced_accuracy: float = 0.08
    program_rate: float = 0.3
    program_accuracy: float = 0.75
    attempts: int = 3
    inputs_per_task: tuple[tuple[int, float], ...] = ()  # ((count, weight), ...): the logged tasks' mix

    def __post_init__(self) -> None:
        if not 1 <= self.attempts <= len(LEVELS):
            raise ValueError(f"attempts: 1 to {len(LEVELS)} per input, got {self.attempts}")
        rates = (self.forced_accuracy, self.program_rate, self.program_accuracy) + (
            () if self.natural_rate is None else (self.natural_rate,))
        if not all(0 <= r <= 1 for r in rates) or self.cap < 2 or self.thinking_sigma < 0:
            raise ValueError("log shape: rates must be in [0, 1], the cap >= 2 and the sigma >= 0")

    def factor(self, thinking: int) -> float:
        for upto, value in self.accuracy_by_length:
            if thinking <= upto:
                return value
        return self.accuracy_by_length[-1][1]


def parse_bins(text: str) -> tuple[tuple[int, float], ...]:
    """ "16000:1.6,48000:1.0" -> ((16000, 1.6), (48000, 1.0)), upper bounds increasing."""
    try:
        bins = tuple((int(a), float(b)) for a, b in (item.split(":") for item in text.split(",") if item))
    except ValueError:
        raise ValueError(f"accuracy-by-length: expected UPTO:FACTOR,..., got {text!r}") from None
    if not bins or any(x[0] >= y[0] for x, y in zip(bins, bins[1:])) or any(f < 0 for _, f in bins):
        raise ValueError(f"accuracy-by-length: increasing bounds and factors >= 0 needed, got {text!r}")
    return bins


def select_tasks(tasks, weights: tuple[tuple[int, float], ...], seed: int = 0) -> list:
    """The most tasks whose test-input counts follow `weights` ((count, weight), ...), in their original order."""
    total = sum(w for _, w in weights)
    by_count: dict[int, list] = {}
    for task in tasks:
        by_count.setdefault(len(task.test_inputs), []).append(task)
    asked = [(count, w / total) for count, w in weights if w > 0]
    missing = [count for count, _ in asked if count not in by_count]
    if missing:
        raise ValueError(f"inputs per task: no task has {missing[0]} test inputs (counts here: "
                         f"{dict(sorted((c, len(v)) for c, v in by_count.items()))})")
    size = min(len(by_count[count]) / share for count, share in asked)  # tasks in all, the rarest count's limit
    rng = random.Random(seed)
    kept = {id(task) for count, share in asked
            for task in rng.sample(by_count[count], min(round(size * share), len(by_count[count])))}
    return [task for task in tasks if id(task) in kept]


def make_records(tasks, seed: int = 0, shape: LogShape = LogShape()) -> list[AttemptRecord]:
    if shape.inputs_per_task:
        tasks = select_tasks(tasks, shape.inputs_per_task, seed)
    rng = random.Random(seed)
    records = []
    for task in tasks:
        difficulty = rng.betavariate(0.7, 0.9)
        median = shape.thinking_easy + (shape.thinking_hard - shape.thinking_easy) * (1 - difficulty)
        for index, label in enumerate(task.test_outputs):
            for attempt, level in LEVELS[:shape.attempts]:
                thinking = int(min(median * rng.lognormvariate(0, shape.thinking_sigma), shape.cap))
                if shape.natural_rate is None:
                    natural = thinking < shape.cap
                else:
                    natural = rng.random() < shape.natural_rate
                    thinking = min(thinking, shape.cap - 1) if natural else shape.cap
                chance = difficulty if not shape.accuracy_by_length else min(
                    1.0, shape.factor(thinking) * difficulty / MEAN_DIFFICULTY)
                right = rng.random() < (chance if natural else shape.forced_accuracy)
                wrong = ((rng.randrange(10),) * 2,) * 2
                perfect = natural and right and rng.random() < shape.program_rate
                outputs = tuple(t if (perfect and rng.random() < shape.program_accuracy) else wrong
                                for t in task.test_outputs) if perfect else ()
                answer = rng.randint(300, 2500)
                records.append(AttemptRecord(
                    task.id, index, attempt, level, seed, shape.cap, natural=natural, thinking_tokens=thinking,
                    answer_tokens=answer, prompt_tokens=rng.randint(2000, 9000), grid=label if right else wrong,
                    program="def transform(grid):\n    ...\n" if perfect else None, train_perfect=perfect,
                    demos_right=len(task.train) if perfect else rng.randint(0, len(task.train) - 1),
                    program_outputs=outputs, started_s=0.0, finished_s=(thinking + answer) / RATE, finish="stop"))
    return records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sim.example_log", description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--seed", type=int, default=0)
    defaults = LogShape()
    parser.add_argument("--cap", type=int, default=defaults.cap, help="the logged thinking cap")
    parser.add_argument("--thinking-easy", type=float, default=defaults.thinking_easy,
                        help="median thinking tokens of the easiest task")
    parser.add_argument("--thinking-hard", type=float, default=defaults.thinking_hard,
                        help="median thinking tokens of the hardest task")
    parser.add_argument("--thinking-sigma", type=float, default=defaults.thinking_sigma)
    parser.add_argument("--natural-rate", type=float, help="share of attempts that end naturally (default: those "
                                                           "whose drawn thinking fits the cap)")
    parser.add_argument("--accuracy-by-length", type=parse_bins, default=(), help="UPTO:FACTOR,...")
    parser.add_argument("--forced-accuracy", type=float, default=defaults.forced_accuracy)
    parser.add_argument("--program-rate", type=float, default=defaults.program_rate)
    parser.add_argument("--program-accuracy", type=float, default=defaults.program_accuracy)
    parser.add_argument("--attempts", type=int, default=defaults.attempts, help="logged attempts per input (1-4)")
    parser.add_argument("--inputs-per-task", help="log only tasks in this mix of test-input counts, COUNT:WEIGHT,...")
    args = parser.parse_args(argv)
    try:
        shape = LogShape(args.cap, args.thinking_easy, args.thinking_hard, args.thinking_sigma, args.natural_rate,
                         args.accuracy_by_length, args.forced_accuracy, args.program_rate, args.program_accuracy,
                         args.attempts, parse_counts(args.inputs_per_task))
        tasks = load_tasks(args.tasks).tasks
        records = make_records(tasks, args.seed, shape)
    except ValueError as err:
        parser.error(str(err))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for record in records:
            f.write(json.dumps(record.to_json(), separators=(",", ":")) + "\n")
    logged = len({r.task_id for r in records})
    print(f"{len(records)} synthetic attempts for {logged} tasks -> {args.out}")


if __name__ == "__main__":
    main()
