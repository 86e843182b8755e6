"""A generated corpus as a task source: real tasks mixed with corpus tasks at a given fraction (issue 19, item 7).

    training.corpus.mix.mixed(real, corpus_dir, fraction, seed) -> list[Task]

The three entry points that consume labelled tasks for training or calibration (`training.traces`, `build.traces`,
`training.grid_tune`) take the same options, `--corpus DIR --corpus-fraction F --corpus-seed S`, and the same
`[corpus]` table in their TOML `--config` (`dir`, `fraction`, `seed`); an option on the command line wins. DIR is a
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
import tomllib
from dataclasses import dataclass, fields
from pathlib import Path

from submission.tasks import LoadError, Task, load_tasks
from training.corpus.generate import SPLIT_DIRS

MANIFEST = "manifest.jsonl"


class CorpusError(ValueError):
    """A corpus folder or mix setting that cannot be used; the message names the folder or file and the field."""


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
    """A `[corpus]` table -> CorpusMix, unknown keys refused by name.

    >>> from_table({"dir": "out/c", "fraction": 0.25}, "x.toml")
    CorpusMix(dir='out/c', fraction=0.25, seed=0)
    >>> from_table({"ratio": 0.25}, "x.toml")
    Traceback (most recent call last):
    training.corpus.mix.CorpusError: x.toml: [corpus]: unknown key(s) ratio (have dir, fraction, seed)
    """
    if not isinstance(table, dict):
        raise CorpusError(f"{source}: corpus: expected a table, got {type(table).__name__}")
    known = [f.name for f in fields(CorpusMix)]
    unknown = sorted(set(table) - set(known))
    if unknown:
        raise CorpusError(f"{source}: [corpus]: unknown key(s) {', '.join(unknown)} (have {', '.join(known)})")
    try:
        return CorpusMix(**table)
    except CorpusError as err:
        raise CorpusError(f"{source}: [corpus]: {err}") from None


def load_config(path: str | Path) -> CorpusMix:
    """The `[corpus]` table of a TOML config (the other keys belong to the config's own reader); none: no corpus."""
    return from_table(tomllib.loads(Path(path).read_text()).get("corpus", {}), str(path))


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


def split_tasks(corpus_dir: str | Path, split: str) -> list[Task]:
    """The corpus's tasks of one manifest split ("train" or "heldout"), checked against the manifest, by id."""
    corpus = Path(corpus_dir)
    manifest = corpus / MANIFEST
    if not manifest.is_file():
        raise CorpusError(f"{corpus}: no {MANIFEST}: not a corpus folder (python -m training.corpus generate --out "
                          f"DIR writes one)")
    names = []
    for number, line in enumerate(manifest.read_text().splitlines(), 1):
        where = f"{manifest} line {number}"
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise CorpusError(f"{where}: not JSON ({err})") from None
        if not isinstance(row, dict) or row.get("split") not in SPLIT_DIRS:
            raise CorpusError(f"{where}: field 'split': {row.get('split') if isinstance(row, dict) else row!r} is "
                              f"not one of {', '.join(SPLIT_DIRS)}")
        if not isinstance(row.get("task"), str):
            raise CorpusError(f"{where}: field 'task': missing or not a string")
        if row["split"] == split:
            names.append((where, row["task"]))
    folder = corpus / SPLIT_DIRS[split]
    try:
        loaded = load_tasks(folder) if names else None
    except LoadError as err:
        raise CorpusError(f"{corpus}: {err}") from None
    if loaded is not None and loaded.errors:
        raise CorpusError(f"{corpus}: {loaded.errors[0]}")
    by_id = {t.id: t for t in loaded.tasks} if loaded is not None else {}
    tasks = []
    for where, name in names:
        if name not in by_id or by_id[name].test_outputs is None:
            raise CorpusError(f"{where}: field 'task': {name} has no labelled task file {folder / name}.json")
        tasks.append(by_id[name])
    return sorted(tasks, key=lambda t: t.id)


def training_tasks(corpus_dir: str | Path) -> list[Task]:
    """The corpus's training split; its heldout/ folder (or a folder inside one) is refused by name."""
    path = Path(corpus_dir)
    inside = [p for p in (path.resolve(), *path.resolve().parents) if p.name == SPLIT_DIRS["heldout"]]
    if path.resolve().name == SPLIT_DIRS["heldout"] or any((p.parent / MANIFEST).exists() for p in inside):
        raise CorpusError(f"{path}: a corpus's {SPLIT_DIRS['heldout']}/ folder (manifest split 'heldout') is kept "
                          "apart for python -m training.corpus.probe; give the corpus folder itself, whose tasks/ "
                          "are mixed in")
    return split_tasks(path, "train")


def mix(real: list[Task], corpus: list[Task], fraction: float, seed: int) -> list[Task]:
    """`real` plus round(fraction * len(real) / (1 - fraction)) tasks of `corpus`, shuffled; seeded. Pure.

    >>> real = [Task(f"r{i}", (), ()) for i in range(6)]
    >>> made = [Task(f"c{i}", (), ()) for i in range(10)]
    >>> out = mix(real, made, 0.25, seed=0)
    >>> len(out), sum(t.id.startswith("c") for t in out), out == mix(real, made, 0.25, seed=0)
    (8, 2, True)
    """
    check_fraction(fraction)
    want = round(fraction * len(real) / (1 - fraction))
    if want > len(corpus):
        raise CorpusError(f"fraction {fraction} of a mix with {len(real)} real tasks needs {want} corpus tasks; the "
                          f"corpus has {len(corpus)} (lower corpus.fraction, or generate more tasks)")
    rng = random.Random(f"corpus-mix:{seed}")
    out = list(real) + rng.sample(sorted(corpus, key=lambda t: t.id), want)
    rng.shuffle(out)
    return out


def mixed(real: list[Task], corpus_dir: str | Path, fraction: float, seed: int) -> list[Task]:
    """Real tasks mixed with the training tasks of the corpus in `corpus_dir` (see `mix`)."""
    return mix(real, training_tasks(corpus_dir), fraction, seed)


def apply(real: list[Task], setting: CorpusMix) -> list[Task]:
    """The mix a config or command line asks for: `real` unchanged when it names no corpus."""
    return mixed(real, setting.dir, setting.fraction, setting.seed) if setting.dir else list(real)
