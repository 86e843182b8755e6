"""The one strict-TOML reader: every error names the file, the section and the key; what it writes reads back."""

import tomllib
from dataclasses import dataclass, field

import pytest

from submission import strict_toml
from submission.reasoning.profile import Profile
from submission.profiles import load_profile, to_toml


@dataclass(frozen=True)
class Inner:
    steps: int = 4
    rate: float = 0.5
    names: tuple[str, ...] = ("a",)


@dataclass(frozen=True)
class Outer:
    name: str = "x"
    flag: bool = False
    inner: Inner = field(default_factory=Inner)


def test_unknown_key_names_file_section_and_key():
    with pytest.raises(strict_toml.TomlError, match=r"f\.toml\.inner: unknown key\(s\) stepz"):
        strict_toml.build(Outer, {"inner": {"stepz": 3}}, "f.toml")


def test_wrong_type_names_the_key():
    with pytest.raises(strict_toml.TomlError, match=r"f\.toml\.inner\.steps: expected int, got str"):
        strict_toml.build(Outer, {"inner": {"steps": "3"}}, "f.toml")


def test_missing_and_invalid_files_name_the_file(tmp_path):
    with pytest.raises(strict_toml.TomlError, match="nope.toml: cannot read"):
        strict_toml.read(tmp_path / "nope.toml")
    bad = tmp_path / "bad.toml"
    bad.write_text("a = [")
    with pytest.raises(strict_toml.TomlError, match="bad.toml: not valid TOML"):
        strict_toml.read(bad)


def test_round_trip_booleans_tuples_and_sections():
    obj = Outer(name='q"z', flag=True, inner=Inner(steps=7, rate=2.0, names=("b", "c")))
    text = strict_toml.to_toml(obj)
    assert strict_toml.build(Outer, tomllib.loads(text), "round trip") == obj


def test_a_shipped_profile_round_trips():
    profile = load_profile("cpu-tiny")
    assert strict_toml.build(Profile, tomllib.loads(to_toml(profile)), "copy") == profile


def test_a_tuple_field_wants_an_array_of_its_element_type():
    with pytest.raises(strict_toml.TomlError, match=r"f\.toml\.inner\.names: expected an array, got str 'q_proj'"):
        strict_toml.build(Outer, {"inner": {"names": "q_proj"}}, "f.toml")  # was ('q', '_', 'p', ...)
    with pytest.raises(strict_toml.TomlError, match=r"f\.toml\.inner\.names\[1\]: expected str, got int 3"):
        strict_toml.build(Outer, {"inner": {"names": ["a", 3]}}, "f.toml")


def test_a_boolean_is_not_an_int():
    with pytest.raises(strict_toml.TomlError, match=r"f\.toml\.inner\.steps: expected int, got bool"):
        strict_toml.build(Outer, {"inner": {"steps": True}}, "f.toml")
