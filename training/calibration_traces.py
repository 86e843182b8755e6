"""Calibration traces for `build.prune.calibrate` from real ARC tasks, through the solver's own prompt renderer.

    python -m training.calibration_traces --model DIR --tasks DIR [--max-tasks 24] [--thinking 96] --out traces.jsonl
                                          [--config FILE.toml] [--corpus DIR --corpus-fraction F --corpus-seed S]

Each trace: the task's prompt exactly as the solver renders it (chat template, thinking on), thinking sampled from the
model itself (T=0.6), then an answer: the true output grid, the program cue and a program (the example program for the
task where examples/programs has one, else a stand-in), with the segment boundaries marked. `--thinking 0` leaves the
thinking empty and never loads the model (checkpoints too large to run whole, e.g. the full-topology ones). For a
real model, prefer traces from a real run (the solver's completions); this maker is for demos and for models that
cannot run the solver. `--corpus` mixes the training tasks of a generated corpus in at `--corpus-fraction` (or as
the `[corpus]` table of `--config` says), as `training.traces` does: training/corpus/mix.py. `--max-tasks` counts the
real tasks (those with an example program first); the corpus adds its share on top. It lives in training/ (it was
`build.traces`) because the corpus mix is training's: build/ imports nothing of training/ (tests/test_imports.py).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from submission.reasoning.reply_grammar import THINK_END
from submission.reasoning.profile import EngineConfig, PromptConfig
from submission.reasoning.prompt import grid_text, render
from submission.tasks import Task, load_tasks
from training.corpus import mix

EXAMPLES = Path(__file__).resolve().parents[1] / "examples" / "programs"
STAND_IN = "def transform(grid):\n    return [row[:] for row in grid]\n"


def make_traces(model_dir: str | Path, tasks, thinking: int = 96, seed: int = 0) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval() if thinking else None
    cue = EngineConfig().program_cue
    out = []
    for number, task in enumerate(tasks):
        _, prompt = render(tokenizer, task, 0, PromptConfig())
        thought = []
        if model is not None:
            torch.manual_seed(seed + number)
            with torch.no_grad():
                generated = model.generate(torch.tensor([prompt]), max_new_tokens=thinking, do_sample=True,
                                           temperature=0.6, top_k=20, top_p=0.95, pad_token_id=tokenizer.pad_token_id)
            thought = generated[0, len(prompt):].tolist()
        example = EXAMPLES / f"{task.id}.py"
        program = example.read_text() if example.exists() else STAND_IN
        body = program.split("def transform(grid):", 1)[1].rstrip() + "\n```"
        before = tokenizer.encode(THINK_END + "\n" + grid_text(task.test_outputs[0]) + "\n" + cue,
                                  add_special_tokens=False)
        program_ids = tokenizer.encode(body, add_special_tokens=False)
        ids = prompt + thought + before + program_ids + [tokenizer.eos_token_id]
        p, t = len(prompt), len(prompt) + len(thought)
        start = t + len(before)
        out.append({"task_id": task.id, "token_ids": ids,
                    "segments": {"prompt": [0, p], "thinking": [p, t], "answer": [t, len(ids)]},
                    "program": [start, start + len(program_ids)]})
    return out


def select_tasks(args: argparse.Namespace) -> list[Task]:
    """The labelled tasks to trace: those with an example program first, cut to --max-tasks, the corpus mixed in."""
    tasks = [t for t in load_tasks(args.tasks).tasks if t.test_outputs is not None]
    chosen = [t for t in tasks if (EXAMPLES / f"{t.id}.py").exists()] + [t for t in tasks
                                                                         if not (EXAMPLES / f"{t.id}.py").exists()]
    return mix.apply(chosen[:args.max_tasks], mix.resolve(args))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m training.calibration_traces", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True, type=Path)
    parser.add_argument("--tasks", required=True, type=Path)
    parser.add_argument("--max-tasks", type=int, default=24)
    parser.add_argument("--thinking", type=int, default=96)
    parser.add_argument("--out", required=True, type=Path)
    mix.add_arguments(parser)
    args = parser.parse_args(argv)
    traces = make_traces(args.model, select_tasks(args), args.thinking)
    args.out.write_text("".join(json.dumps(t) + "\n" for t in traces))
    print(f"{len(traces)} traces, {sum(len(t['token_ids']) for t in traces)} tokens -> {args.out}")


if __name__ == "__main__":
    main()
