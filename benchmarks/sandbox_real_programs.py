"""The sandbox's cost per check on real programs for real ARC tasks, against running them in-process and against a
fresh `python -I` with numpy, in one run, optionally under CPU load.

    python benchmarks/sandbox_real_programs.py [--rounds 20] [--baseline-rounds 2] [--busy 2]

Programs: every hand-written program in examples/programs and tests/wrong_programs (numpy and pure Python, right and
wrong), each checked on its own ARC-AGI-2 training task (all demonstrations and test inputs). Three ways, each
sequential: plain (exec and call `transform` in this process, validate the grids: no isolation at all), the warm
sandbox server, and a fresh `python -I` per check that imports numpy. `--busy N` runs N busy loops meanwhile (the
solver shares its CPUs with the engine and the tokenizer). Prints ms per check and the ratios (RESULTS.md).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from submission.grids import to_grid  # noqa: E402
from submission.sandbox import Sandbox  # noqa: E402
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


def sandboxed(work, rounds: int) -> float:
    with Sandbox() as box:
        for program, task in work:
            box.check(program, task)  # warm-up
        start = time.perf_counter()
        for _ in range(rounds):
            for program, task in work:
                box.check(program, task)
        return (time.perf_counter() - start) / (rounds * len(work))


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
    args = parser.parse_args()
    work = workload()
    burners = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(args.busy)]
    try:
        ms = {"plain": plain(work, args.rounds), "sandbox": sandboxed(work, args.rounds),
              "fresh": fresh(work, args.baseline_rounds)}
    finally:
        for burner in burners:
            burner.kill()
            burner.wait()
    print(f"{len(work)} real programs on their tasks; {args.busy} busy loops on {os.cpu_count()} CPUs")
    for name, seconds in ms.items():
        print(f"{name:8s} {1000 * seconds:7.2f} ms/check")
    print(f"sandbox / plain: {ms['sandbox'] / ms['plain']:.1f}x the cost; "
          f"fresh python -I / sandbox: {ms['fresh'] / ms['sandbox']:.1f}x slower")


if __name__ == "__main__":
    main()
