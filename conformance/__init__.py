"""The shipped profiles against the study's scored runs, as data that a test can hold to account.

    python -m conformance            # rewrite docs/conformance.md from the tables
    python -m conformance --check    # exit 1, saying why, if a table disagrees with its run or the file is stale

One table per scored configuration, `docs/conformance/NAME.toml`: `profile = "NAME"` (a shipped profile, read by its
own line's loader with every default) or `config = "training/rft.toml"` (RFT v1, read by training.rft.load_config).
Each `[section]` lists every setting of that section as `key = { ... }`, one of:
  { study = VALUE, seed = [LINE, ...] }                  the study's value, and the STUDY.md lines that state it
  { study = VALUE, seed = [...], departure = "why" }     the study's value, which the run does not use (and why)
  { unstated = "why the kit's value", kit = VALUE }      the study gives no value: the kit's is recorded, and checked
(`spec = "N"` cites a SPEC section where STUDY.md's excerpts are silent; `note` adds a remark.) A row that cites seed
lines carries `quote`, the study's own words from them, from which its value must be readable (`reading` says how,
where it cannot be read as a number or a word: conformance.quotes). The table's `passages = [[FIRST, LAST], ...]` are
the STUDY.md lines that describe its run: a quote from elsewhere (another run's words, a step shared with another run)
needs `borrowed`, why those words give this run's value, so a value copied from the wrong run with that run's lines
does not pass. Two reserved tables:
`[recipe]`, one row per module group of the profile's build.recipe (`module` names one of its modules; the value is
the scheme the recipe gives it), and `[feature]`, the study engine's features beyond a setting of the kit (`nearest`
names stock vLLM 0.33's closest setting; `kit_setting` the kit's setting that carries it, if any).

The check (`problems`) compares each row with the value the scored run sees: a study value that differs without a
departure, a departure on a row that matches (stale), an unstated row whose recorded value is not the run's, a row
naming no setting, and a setting without a row all fail; so a setting cannot fall back to a default unnoticed. The
run checked is the 12-hour one (boot passes `--deadline`, never `--scale-schedule`, to a scored run). The commit
run's rehearsal (`--scale-schedule`) is a miniature by design, not the scored configuration: `rehearsal_changes`
lists what it scales, and tests/test_conformance.py holds that it scales nothing else and is the identity at 12 hours.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from build.quantize.quantizer import Recipe, load_recipe
from conformance import quotes
from submission import strict_toml
from submission.profiles import load

ROOT = Path(__file__).resolve().parents[1]
TABLES = ROOT / "docs" / "conformance"
DOC = ROOT / "docs" / "conformance.md"
STUDY = ROOT.parent / "shared" / "design" / "STUDY.md"  # the study's passages, beside the checkout (../shared)
ROW_KEYS = {"study", "unstated", "kit", "seed", "spec", "departure", "note", "module", "nearest", "kit_setting",
            "quote", "reading", "borrowed"}


class TableError(strict_toml.TomlError):
    """A table that cannot be read; the message names the file and the row."""


@dataclass(frozen=True)
class Row:
    setting: str  # "section.key"; recipe rows: "recipe.<group>"; feature rows: "feature.<name>"
    study: Any = None  # None: the study states no value (then `unstated` says why the kit's)
    unstated: str = ""
    kit: Any = None  # unstated rows: the kit's value
    seed: tuple[int, ...] = ()
    spec: str = ""
    departure: str = ""
    note: str = ""
    module: str = ""  # recipe rows
    nearest: str = ""  # feature rows: stock vLLM's (or the library's) closest setting
    kit_setting: str = ""  # feature rows: the kit's setting that carries the feature, if any
    quote: str = ""  # the study's words from the cited lines that give the value (conformance.quotes)
    reading: str = ""  # how the quote gives a value that cannot be read from it as a number or a word
    borrowed: str = ""  # why words outside the run's passages (another run's, a shared step's) give this run's value


@dataclass(frozen=True)
class Table:
    path: Path
    title: str
    about: str
    profile: str  # a shipped profile's name, or ""
    config: str  # a training config's path from the repository root, or ""
    rows: tuple[Row, ...]  # settings
    recipe: tuple[Row, ...]
    features: tuple[Row, ...]
    passages: tuple[tuple[int, int], ...] = ()  # the STUDY.md line ranges that describe this run


def _row(setting: str, raw: Any, where: str) -> Row:
    if not isinstance(raw, dict):
        raise TableError(f"{where}: {setting}: expected an inline table {{ study = ..., seed = [...] }}, got {raw!r}")
    unknown = sorted(set(raw) - ROW_KEYS)
    if unknown:
        raise TableError(f"{where}: {setting}: unknown key(s) {', '.join(unknown)} "
                         f"(known: {', '.join(sorted(ROW_KEYS))})")
    row = Row(setting, **{k: tuple(v) if k == "seed" else v for k, v in raw.items()})
    kind = setting.split(".")[0]
    if kind == "feature":
        if not (isinstance(row.study, str) and row.nearest):
            raise TableError(f"{where}: {setting}: a feature row needs study (what the study's engine did) and nearest")
    elif (row.study is None) == (not row.unstated):
        raise TableError(f"{where}: {setting}: give exactly one of study and unstated")
    elif row.unstated and (row.kit is None or row.departure):
        raise TableError(f"{where}: {setting}: an unstated row records the kit's value as kit, and no departure")
    elif row.study is not None and not (row.seed or row.spec):
        raise TableError(f"{where}: {setting}: a study value needs its source: seed = [STUDY.md lines] or spec")
    if (kind == "recipe") != bool(row.module):
        raise TableError(f"{where}: {setting}: a [recipe] row, and only one, names a module of its group (module)")
    if kind != "feature" and (row.nearest or row.kit_setting) or row.study is not None and row.kit is not None:
        raise TableError(f"{where}: {setting}: nearest and kit_setting belong to [feature] rows, kit to unstated rows")
    if row.borrowed and not row.quote:
        raise TableError(f"{where}: {setting}: borrowed says why a quote from another run gives the value: no quote")
    if not all(isinstance(n, int) for n in row.seed):
        raise TableError(f"{where}: {setting}: seed lists STUDY.md line numbers, got {list(row.seed)}")
    return row


def load_table(path: str | Path) -> Table:
    path = Path(path)
    raw = strict_toml.read(path, TableError)
    if ("profile" in raw) == ("config" in raw):
        raise TableError(f"{path}: name exactly one of profile (a shipped profile) and config (a training config)")
    passages = raw.get("passages")
    if not (isinstance(passages, list) and passages and all(
            isinstance(p, list) and len(p) == 2 and all(isinstance(n, int) for n in p) and p[0] <= p[1]
            for p in passages)):
        raise TableError(f"{path}: passages: the STUDY.md line ranges that describe the run, [[first, last], ...], "
                         f"got {passages!r}")
    rows, recipe, features = [], [], []
    for section, table in raw.items():
        if not isinstance(table, dict):
            continue
        into = recipe if section == "recipe" else features if section == "feature" else rows
        into += [_row(f"{section}.{key}", value, str(path)) for key, value in table.items()]
    return Table(path, raw.get("title", path.stem), raw.get("about", ""), raw.get("profile", ""),
                 raw.get("config", ""), tuple(rows), tuple(recipe), tuple(features),
                 tuple((a, b) for a, b in passages))


def tables(folder: Path = TABLES) -> list[Table]:
    return [load_table(p) for p in sorted(folder.glob("*.toml"))]


def settings(config: Any, root: str = "") -> dict[str, Any]:
    """`section.key` -> value of every field of a config tree (tuples as lists, as TOML has them). A field that is a
    dataclass is a section; a plain field of the root is a setting only when `root` names its section (TrainConfig's
    flat fields: "train"), else it is the profile's identity (name, line)."""
    out = {}
    for f in dataclasses.fields(config):
        value = getattr(config, f.name)
        if dataclasses.is_dataclass(value):
            out.update(settings(value, f.name))
        elif root:
            out[f"{root}.{f.name}"] = list(value) if isinstance(value, tuple) else value
    return out


def run_config(table: Table) -> Any:
    """The configuration the scored run uses: the profile with its line's defaults, or the training config."""
    if table.config:
        from training.rft import load_config  # the training line's loader (no torch at import)

        if not (ROOT / table.config).exists():
            raise TableError(f"{table.path}: config: {table.config} does not exist")
        return load_config(ROOT / table.config)
    return load(table.profile)


def effective(table: Table) -> tuple[dict[str, Any], Recipe | None]:
    """The run's settings and its quantisation recipe (None if it has none)."""
    config = run_config(table)
    recipe = getattr(getattr(config, "build", None), "recipe", "")
    return settings(config, "train" if table.config else ""), load_recipe(ROOT / recipe) if recipe else None


def same(a: Any, b: Any) -> bool:
    """TOML equality, strict about booleans (true is not 1)."""
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    return isinstance(a, bool) == isinstance(b, bool) and a == b


def problems(table: Table, values: dict[str, Any], recipe: Recipe | None) -> list[str]:
    """Everything wrong between a table and the run's values; [] when they agree."""
    where = table.path.name
    out = []
    rows = {row.setting: row for row in table.rows}
    for row in table.rows:
        if row.setting not in values:
            out.append(f"{where}: {row.setting}: names no setting of the run")
            continue
        out += _verdict(where, row, values[row.setting])
    out += [f"{where}: {s}: a setting without a row (the run has {strict_toml.value(v)})" for s, v in values.items()
            if s not in rows]
    out += [f"{where}: {row.setting}: kit_setting {row.kit_setting!r} is no setting of the run"
            for row in table.features if row.kit_setting and row.kit_setting not in values]
    if recipe is None:
        return out + [f"{where}: {row.setting}: the run has no recipe" for row in table.recipe]
    for row in table.recipe:
        out += _verdict(where, row, recipe.scheme_for(row.module))
    covered = {_deciding_rule(recipe, row.module) for row in table.recipe}
    return out + [f"{where}: recipe: rules[{i}] ({rule.pattern} -> {rule.scheme}) matches no row's module"
                  for i, rule in enumerate(recipe.rules) if i not in covered]


def _verdict(where: str, row: Row, value: Any) -> list[str]:
    if row.study is None:
        return [] if same(row.kit, value) else [
            f"{where}: {row.setting}: the table records the kit's {strict_toml.value(row.kit)}, the run has "
            f"{strict_toml.value(value)}"]
    if same(row.study, value):
        return [f"{where}: {row.setting}: matches the study ({strict_toml.value(value)}) but keeps a departure: remove "
                "it"] if row.departure else []
    return [] if row.departure else [
        f"{where}: {row.setting}: the study has {strict_toml.value(row.study)}, the run {strict_toml.value(value)}, "
        "and the row gives no departure"]


def _deciding_rule(recipe: Recipe, module: str) -> int | None:
    """The index of the rule that gives `module` its scheme (the first that applies, as Recipe.scheme_for)."""
    return next((i for i, rule in enumerate(recipe.rules) if rule.applies(module)), None)


def citation_problems(table: Table, study_text: str) -> list[str]:
    """Cited seed lines that STUDY.md's excerpts do not contain, and quotes that are not in the lines they cite or do
    not give the row's value (conformance.quotes)."""
    lines = quotes.study_lines(study_text)
    rows = (*table.rows, *table.recipe, *table.features)
    missing = [f"{table.path.name}: {row.setting}: seed line {n} is not in STUDY.md"
               for row in rows for n in row.seed if n not in lines]
    return missing + [p for row in rows if not any(n not in lines for n in row.seed)
                      for p in (quotes.problems(table.path.name, row, lines)
                                or quotes.run_problems(table.path.name, row, lines, table.passages))]


PROCEDURE_ROW = re.compile(r"^\| (?!procedure \|)(?!---)(.+)$", re.MULTILINE)


def procedure_problems(text: str, read: Callable[[str], str]) -> list[str]:
    """docs/conformance/procedures.md's rows (behaviour that is code, not a profile value): each must name at least
    one test as `tests/FILE.py::NAME` (or `::NAME`, the file before it) in its last cell, and each named test must be
    defined in its file (`read(path)` gives the file's text)."""
    out = []
    for row in PROCEDURE_ROW.findall(text):
        cells = [c.strip() for c in row.rstrip(" |").split(" | ")]
        named, file = [], ""
        for path, name in re.findall(r"`(tests/\w+\.py)?::(\w+)`", cells[-1]):
            file = path or file
            named.append((file, name))
        if not named:
            out.append(f"procedures.md: {cells[0]!r}: names no test (tests/FILE.py::NAME)")
        out += [f"procedures.md: {cells[0]!r}: {f}::{n} is not defined" for f, n in named
                if f"def {n}(" not in read(f)]
    return out


def rehearsal_changes(table: Table, time_limit_s: float) -> dict[str, tuple[Any, Any]]:
    """The settings `--scale-schedule` to `time_limit_s` changes: setting -> (scored run's, rehearsal's)."""
    config = run_config(table)
    section = "run" if hasattr(config, "run") else "schedule"
    if not hasattr(config, section):
        return {}
    scaled = dataclasses.replace(config, **{section: getattr(config, section).scaled(time_limit_s)})
    before, after = settings(config), settings(scaled)
    return {k: (before[k], after[k]) for k in before if not same(before[k], after[k])}


INTRO = """# Conformance: the shipped profiles against the study's scored runs

Generated by `python -m conformance` (`make conformance`) from the tables in `docs/conformance/*.toml`; do not edit
by hand. Each table is one scored configuration of the study (`../shared/design/STUDY.md` quotes its passages, by
their line numbers in the study, cited below as "STUDY.md"; SPEC sections where STUDY.md's excerpts are silent). A
row is one setting of the profile's dataclasses (`submission/reasoning/profile.py`, `submission/grid/profile.py`,
`training/rft.py`), every one of them, defaults included: the study's value, the lines that state it and the study's
own words from them (“quoted”), the value the scored run has, and the verdict: *match*; *departure* (the run differs,
for the reason given); *unstated* (the study gives no value: the kit's is recorded and checked); where the value is
not a number or word of the quote, the why column says how the quote gives it. `tests/test_conformance.py`
recomputes every run's value and fails on a difference without a departure, a departure on a row that matches, a
setting without a row, a row without a setting, a cited line that STUDY.md lacks, a quote that is not in its lines or
does not give the row's value, a quote from outside the lines that describe the table's run (its passages, listed
under its title) that does not say why another run's or step's words give this run's value, or this file out of
date.

The value checked is the 12-hour run's: boot passes `--deadline` (the time left) and never `--scale-schedule` to a
scored run. The commit run's rehearsal (`--scale-schedule`) is a miniature of it: the rows it scales are listed under
each table; every other row is the scored run's (tested).

A combined profile (`line = "both"`, e.g. `both-4xL4`) has no table: the study ran the two lines apart, so no scored
run matches it. It names two profiles that have tables here (tested); its split of the GPUs and the merge rule are
the kit's own.
"""


def _cell(value: Any) -> str:
    return strict_toml.value(value).replace("|", "\\|")


def _source(row: Row) -> str:
    cited = ", ".join([str(n) for n in row.seed] + ([f"SPEC {row.spec}"] if row.spec else []))
    return cited + (f": “{row.quote}”".replace("|", "\\|") if row.quote else "")


def _why(row: Row) -> str:
    return "; ".join(t for t in (row.departure or row.unstated, row.note, row.reading and f"read: {row.reading}",
                                 row.borrowed and f"from outside the run's passages: {row.borrowed}")
                     if t).replace("|", "\\|")


def _verdict_word(row: Row, value: Any) -> str:
    if row.study is None:
        return "unstated"
    return "match" if same(row.study, value) else "**departure**" if row.departure else "MISMATCH"


def render_table(table: Table, values: dict[str, Any] | None, recipe: Recipe | None) -> str:
    """One table's section of docs/conformance.md; `values` None when the run's configuration cannot be read."""
    spans = ", ".join(f"{a}-{b}" for a, b in table.passages)
    lines = [f"## {table.title}", "", " ".join(table.about.split()), "",
             f"The run's passages: STUDY.md {spans}. A quote from other lines says why it gives this run's value.", ""]
    if values is None:
        lines += [f"`{table.config or table.profile}` cannot be read: the run column is empty.", ""]
    source = f"`{table.config}`" if table.config else f"`profiles/{table.profile}.toml`"
    lines += [f"| setting | study | STUDY.md | run ({source}) | verdict | why |", "|---|---|---|---|---|---|"]
    for row in table.rows:
        value = (values or {}).get(row.setting)
        shown = _cell(value) if values is not None and row.setting in values else ""
        study = _cell(row.study) if row.study is not None else "not stated"
        verdict = _verdict_word(row, value) if values is not None else ""
        lines.append(f"| {row.setting} | {study} | {_source(row)} | {shown} | {verdict} | "
                     f"{_why(row)} |")
    if table.recipe:
        lines += ["", f"Weights: the recipe's scheme per module group (the recipe is `build.recipe`).", "",
                  "| module group | a module | study | STUDY.md | recipe | verdict | why |",
                  "|---|---|---|---|---|---|---|"]
        for row in table.recipe:
            scheme = recipe.scheme_for(row.module) if recipe else None
            lines.append(f"| {row.setting.split('.', 1)[1]} | `{row.module}` | {row.study} | {_source(row)} | "
                         f"{scheme or ''} | {_verdict_word(row, scheme)} | {_why(row)} |")
    if table.features:
        lines += ["", "The study's engine and training beyond a setting of the kit:", "",
                  "| feature | the study | STUDY.md | nearest stock setting | the kit's setting | why |",
                  "|---|---|---|---|---|---|"]
        lines += [f"| {row.setting.split('.', 1)[1]} | {row.study} | {_source(row)} | {row.nearest} | "
                  f"{row.kit_setting or 'none'} | {_why(row) or 'the kit has it'} |" for row in table.features]
    if values is not None and not table.config:
        scaled = rehearsal_changes(table, REHEARSAL_S)
        lines += ["", f"The rehearsal (`--scale-schedule`, e.g. {REHEARSAL_S:g} s) scales "
                  + ", ".join(f"{k} ({_cell(a)} -> {_cell(b)})" for k, (a, b) in scaled.items()) + "."]
    return "\n".join(lines) + "\n"


REHEARSAL_S = 1800.0  # boot's --rehearsal-deadline default


def render(folder: Path = TABLES) -> str:
    """docs/conformance.md: the introduction, every table with its run's values, then the procedures."""
    parts = [INTRO]
    for table in tables(folder):
        try:
            values, recipe = effective(table)
        except TableError:
            values, recipe = None, None
        parts.append(render_table(table, values, recipe))
    parts.append((folder / "procedures.md").read_text())
    return "\n".join(parts)
