"""The grid-model line (SPEC section 10): a model with a 16-token vocabulary that writes grids directly, adapted to
each task at test time (ttt), searched depth-first (dfs), rescored under fresh views (rescore), run by one worker per
device on a shared queue (workers, main); beside the reasoning line in one run, answers merged (both, merge)."""

from __future__ import annotations

import tomllib
from pathlib import Path

PROFILES = Path(__file__).resolve().parents[2] / "profiles"


def profile_path(name_or_path: str | Path) -> Path:
    path = Path(name_or_path)
    return path if path.suffix else PROFILES / f"{name_or_path}.toml"


def profile_line(name_or_path: str | Path) -> str | None:
    """A profile's `line`: "grid", "both" (submission.grid.both), or None for the reasoning line's profiles (cheap:
    submission.main asks before importing any line)."""
    try:
        return tomllib.loads(profile_path(name_or_path).read_text()).get("line")
    except (OSError, tomllib.TOMLDecodeError):
        return None


def is_grid_profile(name_or_path: str | Path) -> bool:
    """Whether a profile runs through submission/grid/ (`line = "grid"` or `"both"`), not the reasoning line's alone
    (the reasoning line's profile checks leave these out)."""
    return profile_line(name_or_path) in ("grid", "both")
