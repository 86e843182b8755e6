"""The sandbox's cost per check on real programs for real ARC tasks, against running them in-process and against a
fresh `python -I` with numpy, in one run, optionally under CPU load.

    python benchmarks/sandbox_real_programs.py [--rounds 20] [--baseline-rounds 2] [--busy 2]
                                               [--arc-dsl CHECKOUT [--limit 100]]

Programs: every hand-written program in examples/programs and tests/wrong_programs (numpy and pure Python, right and
wrong), each checked on its own ARC-AGI-2 training task (all demonstrations and test inputs). With `--arc-dsl`, a
third-party set instead: the solvers of github.com/michaelhodel/arc-dsl (MIT; a checkout the user points to, never
copied into the kit), 400 programs for the ARC-AGI-1 training tasks written in a DSL of ~160 pure-Python functions
over tuples and frozensets, from one-liners to 60-line object pipelines; `--limit` of them, spread evenly over the
file. Each becomes one self-contained program: the DSL's source (~1,600 lines), the solver, and a `transform` that
converts grids, so every way pays for compiling the DSL on each check, as a program carrying its own helpers does. Three ways, each
sequential: plain (exec and call `transform` in this process, validate the grids: no isolation at all), the warm
sandbox server, and a fresh `python -I` per check that imports numpy. `--busy N` runs N busy loops meanwhile (the
solver shares its CPUs with the engine and the tokenizer). Prints ms per check and the ratios (RESULTS.md).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from submission.grids import to_grid  # noqa: E402
from submission.sandbox.client import Sandbox  # noqa: E402
from submission.tasks import load_tasks  # noqa: E402

ARC_DATA = Path(os.environ.get("ARC_DATA", REPO.parent / "shared" / "arc-data"))
BASELINE = """
import json, sys
import numpy
request = json.loads(sys.stdin.read())
namespace = {}
exec(request["program"], namespace)
out = []
for grid in request["inputs"]:
    try:
        out.append(numpy.asarray(namespace["transform"](grid)).tolist())
    except Exception as err:
        out.append(repr(err))
print(json.dumps(out))
"""


def workload() -> list[tuple[str, object]]:
    programs = [*sorted((REPO / "examples" / "programs").glob("*.py")),
                *sorted((REPO / "tests" / "wrong_programs").glob("*.py"))]
    return [(p.read_text(), load_tasks(ARC_DATA / "arc-agi-2" / "training" / f"{p.stem}.json").tasks[0])
            for p in programs]


def arc_dsl_workload(checkout: Path, limit: int) -> list[tuple[str, object]]:
    """(program, task) pairs from arc-dsl's solvers.py: one solver per ARC-AGI-1 training task."""
    library = "\n".join(line for name in ("arc_types.py", "constants.py", "dsl.py")
                        for line in (checkout / name).read_text().splitlines()
                        if not (line.startswith("from ") and line.endswith(" import *")))
    source = (checkout / "solvers.py").read_text()
    work = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("solve_"):
            file = ARC_DATA / "arc-agi-1" / "training" / f"{node.name.removeprefix('solve_')}.json"
            if file.exists():
                program = (f"{library}\n\n{ast.get_source_segment(source, node)}\n\n\ndef transform(grid):\n"
                           f"    return [list(row) for row in {node.name}(tuple(tuple(row) for row in grid))]\n")
                work.append((program, load_tasks(file).tasks[0]))
    if not work:
        raise SystemExit(f"--arc-dsl {checkout}: no solve_<task id> function of solvers.py has a task under "
                         f"{ARC_DATA / 'arc-agi-1' / 'training'}")
    return work[::max(1, len(work) // limit)][:limit]


def inputs(task) -> list:
    return [p.input for p in task.train] + list(task.test_inputs)


def plain(work, rounds: int) -> float:
    start = time.perf_counter()
    for _ in range(rounds):
        for program, task in work:
            namespace: dict = {}
            exec(compile(program, "<program>", "exec"), namespace)  # noqa: S102 - the unisolated baseline
            for grid in inputs(task):
                try:
                    to_grid(namespace["transform"]([list(row) for row in grid]))
                except Exception:  # noqa: BLE001 - a wrong program may raise; the sandbox reports it too
                    pass
    return (time.perf_counter() - start) / (rounds * len(work))


def sandboxed(work, rounds: int) -> tuple[float, int]:
    """Seconds per check, and how many programs reproduce every demonstration of their task in the sandbox."""
    with Sandbox() as box:
        perfect = sum(box.check(program, task).train_perfect for program, task in work)  # also the warm-up
        start = time.perf_counter()
        for _ in range(rounds):
            for program, task in work:
                box.check(program, task)
        return (time.perf_counter() - start) / (rounds * len(work)), perfect


def fresh(work, rounds: int) -> float:
    start = time.perf_counter()
    for _ in range(rounds):
        for program, task in work:
            request = json.dumps({"program": program, "inputs": inputs(task)})
            subprocess.run([sys.executable, "-I", "-c", BASELINE], input=request, capture_output=True, text=True,
                           check=True, timeout=60)
    return (time.perf_counter() - start) / (rounds * len(work))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--baseline-rounds", type=int, default=2)
    parser.add_argument("--busy", type=int, default=0, help="busy loops running meanwhile")
    parser.add_argument("--arc-dsl", type=Path, help="a checkout of github.com/michaelhodel/arc-dsl: its solvers")
    parser.add_argument("--limit", type=int, default=100, help="with --arc-dsl: how many of its solvers")
    args = parser.parse_args()
    work = arc_dsl_workload(args.arc_dsl, args.limit) if args.arc_dsl else workload()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        boxed, perfect = sandboxed(work, args.rounds)
        ms = {"plain": plain(work, args.rounds), "sandbox": boxed, "fresh": fresh(work, args.baseline_rounds)}
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    source = f"arc-dsl's solvers ({args.arc_dsl})" if args.arc_dsl else "the kit's programs"
    print(f"{len(work)} real programs on their tasks, {source}; {args.busy} busy loops on {os.cpu_count()} CPUs; "
          f"{perfect} reproduce every demonstration in the sandbox")
    for name, seconds in ms.items():
        print(f"{name:8s} {1000 * seconds:7.2f} ms/check")
    print(f"sandbox / plain: {ms['sandbox'] / ms['plain']:.1f}x the cost; "
          f"fresh python -I / sandbox: {ms['fresh'] / ms['sandbox']:.1f}x slower")


if __name__ == "__main__":
    main()
