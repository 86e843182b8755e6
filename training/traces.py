"""Sample the model on labelled ARC tasks through the solver's own engine, prompt renderer and request phases.

    python -m training.traces --model DIR --profile NAME --tasks DIR --out traces.jsonl [--attempts 2] [--cap 48000]
                              [--split training] [--held-out ids.txt] [--leave-one-out] [--max-tasks N]
                              [--inject-known] [--config training/rft-tiny.toml] [--corpus DIR
                              --corpus-fraction F --corpus-seed S]

Every labelled test input is sampled `--attempts` times at thinking cap `--cap`, with seeds from (task, test input,
attempt, "rft") by a stable hash, so reruns and other machines make the same requests. The prompt is the inference
prompt (submission.reasoning.prompt.render through the model's tokenizer, with the `--profile`'s `[prompt]`: its grid
format among the rest), and each line stores its token ids, the completion's
token ids exactly as sampled, the parsed grid and the label. Tasks listed in `--held-out` are never sampled.
`--leave-one-out` (for evaluation tasks) also makes views where a test pair becomes a demonstration and a
demonstration becomes the query. Resumable: requests already in --out are skipped. `--inject-known` (demos only) adds
one known-correct trace per input, written by this script, not the model, and marked `"injected": true`, so that a
random-weight model still exercises the whole path. `--corpus` mixes the training tasks of a generated corpus in at
`--corpus-fraction` (or as the `[corpus]` table of `--config`, the RFT run's config, says): training/corpus/mix.py.
`--max-tasks` counts the real tasks; the corpus adds its share on top.
"""

from __future__ import annotations

import argparse
import asyncio
import json
from dataclasses import replace
from pathlib import Path

from submission.reasoning.reply_grammar import THINK_END, parse_answer
from submission.reasoning.engines.base import GenerationRequest
from submission.profiles import load_profile
from submission.reasoning.prompt import grid_text, render
from submission.schedule import stable_seed
from submission.tasks import Pair, Task, load_tasks
from training.corpus import mix

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "programs"


def leave_one_out(task: Task) -> list[Task]:
    """Views of a labelled task where test pair i becomes a demonstration and demonstration j the query. Pure."""
    out = []
    for i, (test_input, test_output) in enumerate(zip(task.test_inputs, task.test_outputs or ())):
        for j, demo in enumerate(task.train):
            train = tuple(p for k, p in enumerate(task.train) if k != j) + (Pair(test_input, test_output),)
            out.append(Task(f"{task.id}~t{i}d{j}", train, (demo.input,), (demo.output,)))
    return out


def known_trace(tokenizer, task: Task, index: int, prompt: list[int], cue: str) -> dict:
    program = (EXAMPLES / f"{task.id}.py").read_text() if (EXAMPLES / f"{task.id}.py").exists() else \
        "def transform(grid):\n    return grid\n"
    text = (f"Injected known-correct trace (not sampled from the model).{THINK_END}\n"
            f"{grid_text(task.test_outputs[index])}\n{cue}{program.split('def transform(grid):', 1)[1]}```")
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.eos_token_id]
    return {"text": text, "token_ids": ids, "natural": True, "injected": True}


async def sample(engine, tokenizer, tasks: list[Task], split: str, attempts: int, cap: int, done: set,
                 prompt_config, cue: str, inject: bool, out) -> int:
    written = 0
    for task in tasks:
        for index, label in enumerate(task.test_outputs or ()):
            prompt = render(tokenizer, task, index, prompt_config)[1]
            jobs = []
            for attempt in range(1, attempts + 1):
                if (task.id, index, attempt) in done:
                    continue
                seed = stable_seed(task.id, index, attempt, "rft")
                jobs.append((attempt, seed, engine.generate(
                    GenerationRequest(f"{task.id}/{index}/{attempt}", tuple(prompt), cap, seed))))
            results = await asyncio.gather(*(job for _, _, job in jobs))
            rows = [(attempt, seed, {"text": c.text, "token_ids": list(c.token_ids), "natural": c.natural,
                                     "injected": False}) for (attempt, seed, _), c in zip(jobs, results)]
            if inject and (task.id, index, 0) not in done:
                rows.append((0, 0, known_trace(tokenizer, task, index, prompt, engine.config.program_cue)))
            for attempt, seed, completion in rows:
                parsed = parse_answer(completion["text"])
                record = {"task_id": task.id, "test_index": index, "attempt": attempt, "split": split, "seed": seed,
                          "cap": cap, "prompt_ids": prompt, "completion_ids": completion["token_ids"],
                          "text": completion["text"], "natural": completion["natural"],
                          "grid": [list(r) for r in parsed.grid] if parsed.grid else None,
                          "label": [list(r) for r in label], "injected": completion["injected"]}
                out.write(json.dumps(record) + "\n")
                out.flush()
                written += 1
    return written


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m training.traces", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--profile", default="cpu-tiny")
    parser.add_argument("--tasks", required=True, type=Path)
    parser.add_argument("--out", required=True, type=Path)
    parser.add_argument("--attempts", type=int, default=2)
    parser.add_argument("--cap", type=int, default=48_000)
    parser.add_argument("--split", default="training", choices=["training", "evaluation"])
    parser.add_argument("--held-out", type=Path, help="task ids never to sample, one per line")
    parser.add_argument("--leave-one-out", action="store_true")
    parser.add_argument("--max-tasks", type=int)
    parser.add_argument("--inject-known", action="store_true")
    mix.add_arguments(parser)
    return parser.parse_args(argv)


def select_tasks(args: argparse.Namespace) -> list[Task]:
    """The labelled tasks to sample: --tasks less --held-out, cut to --max-tasks, the corpus mixed in, then the
    leave-one-out views."""
    held = set(args.held_out.read_text().split()) if args.held_out else set()
    tasks = [t for t in load_tasks(args.tasks).tasks if t.test_outputs is not None and t.id not in held]
    tasks = mix.apply(tasks[:args.max_tasks] if args.max_tasks else tasks, mix.resolve(args))
    if args.leave_one_out:
        tasks += [view for t in tasks for view in leave_one_out(t)]
    return tasks


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    tasks = select_tasks(args)
    from transformers import AutoTokenizer

    from submission.reasoning.engines import make_engine

    done = set()
    if args.out.exists():
        done = {(r["task_id"], r["test_index"], r["attempt"]) for r in map(json.loads, args.out.read_text().splitlines())}
    profile = load_profile(args.profile)
    profile = replace(profile, engine=replace(profile.engine, model=str(args.model)))
    tokenizer = AutoTokenizer.from_pretrained(args.model)

    async def run() -> int:
        engine = make_engine(profile)
        await engine.start()
        try:
            with open(args.out, "a") as out:
                return await sample(engine, tokenizer, tasks, args.split, args.attempts, args.cap, done,
                                    profile.prompt, profile.engine.program_cue, args.inject_known, out)
        finally:
            await engine.close()

    written = asyncio.run(run())
    print(f"{written} traces -> {args.out} ({len(done)} already there)")


if __name__ == "__main__":
    main()
