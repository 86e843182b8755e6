"""Make the example attempt log that `make simulate` ships with. It is synthetic, and says so.

    python -m sim.example_log --tasks ARC_DATA/arc-agi-2/evaluation --out sim/data/example_attempts.jsonl

No real 12-hour run of a 27B or MoE model can be made here, so the example is generated from the numbers SPEC states
(a published study): forced completions are right about 8% of the time and natural ones 42-86%; train-perfect
programs are right 73-78% of the time. Per task a difficulty d ~ Beta(0.7, 0.9) sets the chance that a natural answer
is right (d) and the median thinking length (20K + 50K x (1 - d) tokens, lognormal, sigma 0.6); thinking beyond the
logged cap (96K) was forced; a natural right answer comes with a train-perfect program with chance 0.3, which is right
with chance 0.75. Durations follow 8 tokens/s per stream. Grids are the real labels when right, else a wrong grid.
Use your own run's log (`submission.main --log`) for forecasts that matter.
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

from submission.attempts import AttemptRecord
from submission.schedule import Level
from submission.tasks import load_tasks

CAP = 96_000
RATE = 8.0


def make_records(tasks, seed: int = 0) -> list[AttemptRecord]:
    rng = random.Random(seed)
    records = []
    for task in tasks:
        difficulty = rng.betavariate(0.7, 0.9)
        median = 20_000 + 50_000 * (1 - difficulty)
        for index, label in enumerate(task.test_outputs):
            for attempt, level in ((1, Level.FIRST), (2, Level.SECOND), (3, Level.EXTRA)):
                thinking = int(min(median * rng.lognormvariate(0, 0.6), CAP))
                natural = thinking < CAP
                right = rng.random() < (difficulty if natural else 0.08)
                wrong = ((rng.randrange(10),) * 2,) * 2
                perfect = natural and right and rng.random() < 0.3
                outputs = tuple(t if (perfect and rng.random() < 0.75) else wrong for t in task.test_outputs) \
                    if perfect else ()
                answer = rng.randint(300, 2500)
                records.append(AttemptRecord(
                    task.id, index, attempt, level, seed, CAP, natural=natural, thinking_tokens=thinking,
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
    args = parser.parse_args(argv)
    tasks = load_tasks(args.tasks).tasks
    records = make_records(tasks, args.seed)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with open(args.out, "w") as f:
        for record in records:
            f.write(json.dumps(record.to_json(), separators=(",", ":")) + "\n")
    print(f"{len(records)} synthetic attempts for {len(tasks)} tasks -> {args.out}")


if __name__ == "__main__":
    main()
