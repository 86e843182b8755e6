"""A generated corpus as a task source: real tasks mixed with corpus tasks at a given fraction (issue 19, item 7).

    training.corpus.mix.mixed(real, corpus_dir, fraction, seed) -> list[Task]

The corpus is streamed (issue 32): the manifest is read line by line for task names, and only the drawn tasks' files
are read, so a million-task corpus is never in memory.

The three entry points that consume labelled tasks for training or calibration (`training.traces`,
`training.calibration_traces`, `training.grid_tune`) take the same options, `--corpus DIR --corpus-fraction F
--corpus-seed S`, and the same `[corpus]` table in their TOML `--config` (`dir`, `fraction`, `seed`); an option on
the command line wins. DIR is a
corpus folder as `python -m training.corpus generate` writes it: only its training split (`tasks/`, manifest
`split = "train"`) is ever mixed in. Its `heldout/` folder is refused: held-out rules are kept apart for the transfer
probe (`python -m training.corpus.probe`), so that it measures transfer, not recall.

`fraction` is the corpus's share of the result: with n real tasks, round(fraction * n / (1 - fraction)) corpus tasks
are drawn without replacement, by a seeded generator from the corpus sorted by id, and the whole list is shuffled by
the same generator; the same inputs and seed give the same list. In the study behind SPEC, no model trained with
synthetic tasks beat the model trained on real tasks alone (SPEC 11): mix for calibration, curricula and experiments,
and measure what the mix does.
"""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from submission import strict_toml
from submission.tasks import LoadError, Task, load_tasks
from training.corpus.generate import SPLIT_DIRS
from training.corpus.store import CorpusError

MANIFEST = "manifest.jsonl"


def check_fraction(fraction: float) -> None:
    if not 0 <= fraction < 1:
        raise CorpusError(f"corpus.fraction must be in [0, 1), not {fraction} (1 would leave no real task)")


@dataclass(frozen=True)
class CorpusMix:
    """The `[corpus]` table of a training or calibration config."""

    dir: str = ""  # corpus folder (generate's --out); "" = real tasks only, whatever the fraction says
    fraction: float = 0.0  # the corpus's share of the mixed task list, 0 <= fraction < 1
    seed: int = 0  # which corpus tasks are drawn, and the order of the mix

    def __post_init__(self) -> None:
        check_fraction(self.fraction)
        if self.dir and self.fraction == 0:
            raise CorpusError(f"corpus.dir is {self.dir!r} but corpus.fraction is 0: no corpus task would be used")


def from_table(table: object, source: str) -> CorpusMix:
    """A `[corpus]` table -> CorpusMix, read by submission.strict_toml: unknown keys and wrong types refused by name.

    >>> from_table({"dir": "out/c", "fraction": 0.25}, "x.toml")
    CorpusMix(dir='out/c', fraction=0.25, seed=0)
    >>> from_table({"ratio": 0.25}, "x.toml")
    Traceback (most recent call last):
    training.corpus.store.CorpusError: x.toml: [corpus]: unknown key(s) ratio (known: dir, fraction, seed)
    """
    try:
        return strict_toml.build(CorpusMix, table, f"{source}: [corpus]")
    except strict_toml.TomlError as err:
        raise CorpusError(str(err)) from None


def load_config(path: str | Path) -> CorpusMix:
    """The `[corpus]` table of a TOML config (the other keys belong to the config's own reader); none: no corpus."""
    try:
        table = strict_toml.read(path)
    except strict_toml.TomlError as err:
        raise CorpusError(str(err)) from None
    return from_table(table.get("corpus", {}), str(path))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every entry point takes; each overrides the `[corpus]` table of `--config`."""
    group = parser.add_argument_group("corpus mix (training/corpus/mix.py)")
    group.add_argument("--config", type=Path, help="TOML config whose [corpus] table (dir, fraction, seed) applies")
    group.add_argument("--corpus", help="corpus folder (python -m training.corpus generate --out); its tasks/ only")
    group.add_argument("--corpus-fraction", type=float, help="the corpus's share of the task list, in [0, 1)")
    group.add_argument("--corpus-seed", type=int, help="which corpus tasks, and the order of the mix")


def resolve(args: argparse.Namespace) -> CorpusMix:
    """The mix a command line asks for: `--config`'s [corpus] table, then the options on top."""
    base = load_config(args.config) if args.config else CorpusMix()
    return CorpusMix(args.corpus if args.corpus is not None else base.dir,
                     args.corpus_fraction if args.corpus_fraction is not None else base.fraction,
                     args.corpus_seed if args.corpus_seed is not None else base.seed)


def split_names(corpus_dir: str | Path, split: str) -> dict[str, str]:
    """The names of the corpus's tasks of one manifest split ("train" or "heldout"), sorted, each with its manifest
    line, from the manifest read line by line (the tasks themselves are not read)."""
    corpus = Path(corpus_dir)
    manifest = corpus / MANIFEST
    if not manifest.is_file():
        raise CorpusError(f"{corpus}: no {MANIFEST}: not a corpus folder (python -m training.corpus generate --out "
                          f"DIR writes one)")
    names = []
    with open(manifest) as lines:
        for number, line in enumerate(lines, 1):
            where = f"{manifest} line {number}"
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise CorpusError(f"{where}: not JSON ({err})") from None
            if not isinstance(row, dict) or row.get("split") not in SPLIT_DIRS:
                raise CorpusError(f"{where}: field 'split': {row.get('split') if isinstance(row, dict) else row!r} "
                                  f"is not one of {', '.join(SPLIT_DIRS)}")
            if not isinstance(row.get("task"), str):
                raise CorpusError(f"{where}: field 'task': missing or not a string")
            if row["split"] == split:
                names.append((row["task"], where))
    return dict(sorted(names))


def load_task(corpus_dir: str | Path, split: str, name: str, where: str) -> Task:
    """One labelled corpus task of a split, read from its file; a missing, unreadable or unlabelled file raises
    CorpusError naming it and `where` (its manifest line)."""
    path = Path(corpus_dir) / SPLIT_DIRS[split] / f"{name}.json"
    missing = f"{where}: field 'task': {name} has no labelled task file {path}"
    if not path.is_file():
        raise CorpusError(missing)
    try:
        loaded = load_tasks(path)
    except LoadError as err:
        raise CorpusError(f"{missing} ({err})") from None
    if loaded.errors:
        raise CorpusError(f"{Path(corpus_dir)}: {loaded.errors[0]}")
    if len(loaded.tasks) != 1 or loaded.tasks[0].test_outputs is None:
        raise CorpusError(missing)
    return loaded.tasks[0]


def split_tasks(corpus_dir: str | Path, split: str) -> list[Task]:
    """Every task of one split, by id (the probe's held-out panel; a mix draws from `split_names` instead)."""
    return [load_task(corpus_dir, split, name, where) for name, where in split_names(corpus_dir, split).items()]


def _training_dir(corpus_dir: str | Path) -> Path:
    """The corpus folder, its heldout/ folder (or a folder inside one) refused by name."""
    path = Path(corpus_dir)
    inside = [p for p in (path.resolve(), *path.resolve().parents) if p.name == SPLIT_DIRS["heldout"]]
    if path.resolve().name == SPLIT_DIRS["heldout"] or any((p.parent / MANIFEST).exists() for p in inside):
        raise CorpusError(f"{path}: a corpus's {SPLIT_DIRS['heldout']}/ folder (manifest split 'heldout') is kept "
                          "apart for python -m training.corpus.probe; give the corpus folder itself, whose tasks/ "
                          "are mixed in")
    return path


def training_tasks(corpus_dir: str | Path) -> list[Task]:
    """The corpus's whole training split; its heldout/ folder is refused by name."""
    return split_tasks(_training_dir(corpus_dir), "train")


def mix(real: list[Task], corpus: list[str], fraction: float, seed: int, load: Callable[[str], Task]) -> list[Task]:
    """`real` plus round(fraction * len(real) / (1 - fraction)) of the tasks named in `corpus`, each read by `load`,
    shuffled; seeded. Pure but for `load`.

    >>> real = [Task(f"r{i}", (), ()) for i in range(6)]
    >>> load = lambda name: Task(name, (), ())
    >>> out = mix(real, [f"c{i}" for i in range(10)], 0.25, 0, load)
    >>> len(out), sum(t.id.startswith("c") for t in out), out == mix(real, [f"c{i}" for i in range(10)], 0.25, 0, load)
    (8, 2, True)
    """
    check_fraction(fraction)
    want = round(fraction * len(real) / (1 - fraction))
    if want > len(corpus):
        raise CorpusError(f"fraction {fraction} of a mix with {len(real)} real tasks needs {want} corpus tasks; the "
                          f"corpus has {len(corpus)} (lower corpus.fraction, or generate more tasks)")
    rng = random.Random(f"corpus-mix:{seed}")
    out = list(real) + [load(name) for name in rng.sample(sorted(corpus), want)]
    rng.shuffle(out)
    return out


def mixed(real: list[Task], corpus_dir: str | Path, fraction: float, seed: int) -> list[Task]:
    """Real tasks mixed with tasks of the training split of the corpus in `corpus_dir` (see `mix`): the manifest's
    names are streamed and only the drawn tasks are read."""
    path = _training_dir(corpus_dir)
    names = split_names(path, "train")
    return mix(real, list(names), fraction, seed, lambda name: load_task(path, "train", name, names[name]))


def apply(real: list[Task], setting: CorpusMix) -> list[Task]:
    """The mix a config or command line asks for: `real` unchanged when it names no corpus."""
    return mixed(real, setting.dir, setting.fraction, setting.seed) if setting.dir else list(real)
