"""Run profiles: one TOML file per run, the whole truth of it (STYLE 3); `load` reads any of them.

A profile's `line` says which of three kinds it is, and so which dataclass it is read into:
    (no line)      the reasoning line      submission.reasoning.profile.Profile  profiles/cpu-tiny.toml,
                                                                                 profiles/dense-27b-4xL4.toml
    line = "grid"  the grid-model line     submission.grid.profile.GridProfile    profiles/grid-*.toml
    line = "both"  both lines in one run   BothProfile (below)                   profiles/both-*.toml
Unknown sections and keys are refused with the file, the section and the key (submission.strict_toml); `to_toml`
writes every value back (a run's copy of its profile; the combined run hands each line its own). `profiles/NAME.toml`
holds the shipped profiles. Standard library only besides the kit: preflight's machine stage loads profiles on
Kaggle's bare Python, before the wheels are installed (issue 27).
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from submission import strict_toml
from submission.reasoning.profile import Profile
from submission.grid.profile import GridProfile

PROFILES = Path(__file__).resolve().parents[1] / "profiles"
MERGE_S = 15.0  # a combined run's lines stop this much before the run: room for their shutdown and the last merge


class ProfileError(strict_toml.TomlError):
    """A profile that cannot be used; the message names the file, the section and the key."""


@dataclass(frozen=True)
class ReasoningShare:
    profile: str = "dense-27b-4xL4"  # the reasoning line's own profile (name or path)
    model: str = ""  # overrides engine.model
    devices: str = ""  # CUDA_VISIBLE_DEVICES of its process ("" = as inherited)
    tensor_parallel_size: int = 0  # 0 = the profile's own


@dataclass(frozen=True)
class GridShare:
    profile: str = "grid-4b-4xL4"
    model: str = ""  # overrides model.path
    devices: str = ""  # CUDA_VISIBLE_DEVICES of its process ("" = as inherited)
    workers: tuple[str, ...] = ()  # overrides run.devices (one worker each); () = the profile's own
    max_len: tuple[int, ...] = ()  # overrides run.max_len; () = the profile's own


@dataclass(frozen=True)
class BothProfile:
    """Both lines in one run (submission.both): each line's own profile and its share of the machine."""

    name: str = "both"
    line: str = "both"
    time_limit_s: float = 12 * 3600  # both lines get it (--deadline overrides); each keeps its own margins
    poll_s: float = 2.0  # how often the logs are looked at
    reasoning: ReasoningShare = field(default_factory=ReasoningShare)
    grid: GridShare = field(default_factory=GridShare)


AnyProfile = Profile | GridProfile | BothProfile
TYPES: dict[str | None, type] = {None: Profile, "grid": GridProfile, "both": BothProfile}  # by `line`
NAMES = {Profile: "a reasoning-line profile", GridProfile: "a grid-line profile", BothProfile: "a combined profile"}


def path_of(name_or_path: str | Path) -> Path:
    """A shipped profile's file by name (profiles/NAME.toml), or the path itself."""
    path = Path(name_or_path)
    return path if path.suffix else PROFILES / f"{name_or_path}.toml"


def profile_line(name_or_path: str | Path) -> str | None:
    """A profile's `line` ("grid", "both", None for the reasoning line), None for a file that cannot be read
    (`load` says why). For listings that sort profiles by line before loading any."""
    try:
        return tomllib.loads(path_of(name_or_path).read_text()).get("line")
    except (OSError, tomllib.TOMLDecodeError):
        return None


def is_grid_profile(name_or_path: str | Path) -> bool:
    """Whether a profile runs through submission/grid/ (`line = "grid"` or `"both"`)."""
    return profile_line(name_or_path) in ("grid", "both")


def read(name_or_path: str | Path) -> tuple[Path, dict[str, Any]]:
    """A profile's path and TOML table, its name defaulting to the file's stem."""
    path = path_of(name_or_path)
    try:
        raw = strict_toml.read(path, ProfileError)
    except ProfileError as err:
        if path.is_file():  # there, but not TOML
            raise
        raise ProfileError(f"{err}; shipped profiles: {', '.join(sorted(p.stem for p in PROFILES.glob('*.toml')))}")
    raw.setdefault("name", path.stem)
    return path, raw


def from_table(cls: type, table: Any, where: str) -> Any:
    """`cls` (a profile or one of its sections) from a TOML table, refused with ProfileError at `where`."""
    return strict_toml.build(cls, table, where, ProfileError)


def load(name_or_path: str | Path) -> AnyProfile:
    """The profile by name or path, read into the type its `line` names."""
    path, raw = read(name_or_path)
    line = raw.get("line")
    if line not in TYPES:
        raise ProfileError(f"{path}: line: must be \"grid\", \"both\" or absent (the reasoning line), not {line!r}")
    return from_table(TYPES[line], raw, str(path))


def _load_as(name_or_path: str | Path, cls: type) -> Any:
    path, raw = read(name_or_path)
    line = next(k for k, v in TYPES.items() if v is cls)
    if line is not None and raw.get("line") != line:
        raise ProfileError(f"{path}: line: not {NAMES[cls]} (needs line = \"{line}\")")
    return from_table(cls, raw, str(path))


def load_profile(name_or_path: str | Path) -> Profile:
    """A reasoning-line profile (`load`, which for another line's file refuses its `line` key by name)."""
    return _load_as(name_or_path, Profile)


def load_grid_profile(name_or_path: str | Path) -> GridProfile:
    return _load_as(name_or_path, GridProfile)


def load_both_profile(name_or_path: str | Path) -> BothProfile:
    return _load_as(name_or_path, BothProfile)


def to_toml(profile: AnyProfile) -> str:
    """The profile as TOML, every value, defaults included: what `load` reads back."""
    return strict_toml.to_toml(profile)


def line_configs(both: BothProfile, time_limit_s: float | None = None,
                 scale: bool = False) -> tuple[Profile, GridProfile]:
    """The two lines' profiles with their shares of the machine applied and, given `time_limit_s`, the run's time
    limit (`scale`: their margins and caps scaled to it, as --scale-schedule does for one line). The combined run
    starts its lines with these; preflight checks each line's share and sim.grid forecasts the run with them."""
    reasoning = load_profile(both.reasoning.profile)
    engine = reasoning.engine
    if both.reasoning.model:
        engine = replace(engine, model=both.reasoning.model)
    if both.reasoning.tensor_parallel_size:
        engine = replace(engine, tensor_parallel_size=both.reasoning.tensor_parallel_size)
    schedule = reasoning.schedule
    if time_limit_s is not None:
        schedule = schedule.scaled(time_limit_s) if scale else replace(schedule, time_limit_s=time_limit_s)
    reasoning = replace(reasoning, name=f"{both.name}-reasoning", engine=engine, schedule=schedule)
    grid = load_grid_profile(both.grid.profile)
    run = grid.run
    if time_limit_s is not None:
        run = run.scaled(time_limit_s) if scale else replace(run, time_limit_s=time_limit_s)
    if both.grid.workers:
        run = replace(run, devices=both.grid.workers)
    if both.grid.max_len:
        run = replace(run, max_len=both.grid.max_len)
    model = replace(grid.model, path=both.grid.model) if both.grid.model else grid.model
    return reasoning, replace(grid, name=f"{both.name}-grid", model=model, run=run)


def line_profiles(both: BothProfile, time_limit_s: float, scale: bool = False) -> tuple[str, str]:
    """The two lines' profiles as TOML (line_configs), each line's copy in its folder."""
    reasoning, grid = line_configs(both, time_limit_s, scale)
    return to_toml(reasoning), to_toml(grid)
