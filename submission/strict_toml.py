"""Strict TOML: the one reader and writer of the kit's TOML files (profiles, recipes, scenarios, serving models,
training configs, corpus mixes).

A typo in a 12-hour run's settings must stop the run before it starts, not be ignored: `build` refuses unknown keys
and wrong types, and every error names the file, the section and the key (`profiles/x.toml: schedule.cap: ...`).
`to_toml` writes what `build` reads back (booleans as `true`/`false`, nested dataclasses as sections).
"""

from __future__ import annotations

import dataclasses
import tomllib
import typing
from pathlib import Path
from typing import Any


class TomlError(ValueError):
    """A TOML file that cannot be used; the message names the file, the section and the key."""


def read(path: str | Path, error: type[TomlError] = TomlError) -> dict[str, Any]:
    """The file's table; a missing file or invalid TOML raises `error` naming the file."""
    path = Path(path)
    try:
        return tomllib.loads(path.read_text())
    except OSError as err:
        raise error(f"{path}: cannot read ({err.strerror})") from None
    except tomllib.TOMLDecodeError as err:
        raise error(f"{path}: not valid TOML: {err}") from None


def build(cls: type, table: Any, where: str, error: type[TomlError] = TomlError) -> Any:
    """`cls(**table)` for a dataclass, nested dataclass fields built from their sub-tables; unknown keys, a value of
    the wrong type and the dataclass's own checks (`__post_init__`) raise `error` at `where` (file and section)."""
    if not isinstance(table, dict):
        raise error(f"{where}: expected a table, got {type(table).__name__}")
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(table) - names)
    if unknown:
        raise error(f"{where}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(names))})")
    values = {}
    for key, value in table.items():
        hint = hints[key]
        if dataclasses.is_dataclass(hint):
            values[key] = build(hint, value, f"{where}.{key}", error)
        else:
            values[key] = _checked(hint, value, f"{where}.{key}", error)
    try:
        return cls(**values)
    except (TypeError, ValueError) as err:
        raise error(f"{where}: {err}") from None


def _checked(hint: Any, value: Any, where: str, error: type[TomlError]) -> Any:
    """`value` as a field of type `hint` holds it: an int where a float is wanted becomes a float, an array where a
    tuple is wanted a tuple with each element checked (`where[i]`); a value of another type raises `error`. Hints
    that are not plain types or tuples (unions, `Any`) pass the value on for the dataclass's own checks."""
    if typing.get_origin(hint) is tuple:
        if not isinstance(value, (list, tuple)):  # a tuple: a caller's own built value
            raise error(f"{where}: expected an array, got {type(value).__name__} {value!r}")
        args = typing.get_args(hint)
        if len(args) == 2 and args[1] is Ellipsis:
            args = (args[0],) * len(value)
        elif args and len(args) != len(value):
            raise error(f"{where}: expected {len(args)} elements, got {len(value)}")
        return tuple(_checked(a, v, f"{where}[{i}]", error) for i, (a, v) in enumerate(zip(args, value))) \
            if args else tuple(value)
    if hint is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(hint, type) and (not isinstance(value, hint) or (hint is int and isinstance(value, bool))):
        raise error(f"{where}: expected {hint.__name__}, got {type(value).__name__} {value!r}")
    return value


def value(v: Any) -> str:
    """One value as TOML spells it."""
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(value(x) for x in v) + "]"
    return '"' + str(v).replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def to_toml(obj: Any, top: dict[str, Any] | None = None) -> str:
    """A dataclass as TOML: `top`'s keys first, then its plain fields, then one section per dataclass field, every
    value written (defaults included) so that `build` reads back the same object."""
    lines = [f"{k} = {value(v)}" for k, v in (top or {}).items()]
    sections = []
    for f in dataclasses.fields(obj):
        v = getattr(obj, f.name)
        if dataclasses.is_dataclass(v):
            sections.append((f.name, v))
        elif f.name not in (top or {}):
            lines.append(f"{f.name} = {value(v)}")
    for name, section in sections:
        lines.append(f"\n[{name}]")
        lines.extend(f"{k} = {value(v)}" for k, v in dataclasses.asdict(section).items())
    return "\n".join(lines) + "\n"
