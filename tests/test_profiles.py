"""One profile loader for the three lines (submission.profiles, issue 30): `load` reads every shipped profile into
the type its `line` names, `to_toml` writes what `load` reads back, and a profile of the wrong line is refused by
name."""

from __future__ import annotations

import pytest

from submission.reasoning.profile import Profile
from submission.grid.profile import GridProfile
from submission.profiles import (PROFILES, BothProfile, ProfileError, load, load_both_profile, load_grid_profile,
                                 profile_line, to_toml)

LINES = {None: Profile, "grid": GridProfile, "both": BothProfile}


@pytest.mark.parametrize("name", sorted(p.stem for p in PROFILES.glob("*.toml")))
def test_every_shipped_profile_loads_as_its_line_and_round_trips(name, tmp_path):
    profile = load(name)
    assert type(profile) is LINES[profile_line(name)] and profile.name == name
    copy = tmp_path / f"{name}.toml"
    copy.write_text(to_toml(profile))
    assert load(copy) == profile


def test_a_profile_of_another_line_is_refused_naming_the_file_and_the_line():
    with pytest.raises(ProfileError, match=r"cpu-tiny.toml: line: not a grid-line profile \(needs line = \"grid\"\)"):
        load_grid_profile("cpu-tiny")
    with pytest.raises(ProfileError, match=r"grid-tiny.toml: line: not a combined profile"):
        load_both_profile("grid-tiny")


def test_an_unknown_line_is_refused_by_name(tmp_path):
    path = tmp_path / "odd.toml"
    path.write_text('line = "grids"\n')
    with pytest.raises(ProfileError, match=r"odd.toml: line: must be \"grid\", \"both\" or absent"):
        load(path)
