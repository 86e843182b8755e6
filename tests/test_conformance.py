"""The conformance tables (docs/conformance/*.toml) against the runs they describe: every setting of a shipped
profile (and of RFT v1's training/rft.toml) has a row with the study's value and the STUDY.md lines that state it;
the run's value, defaults included, must equal the study's unless the row gives a departure, and a departure on a
row that matches is stale. docs/conformance.md is generated from the tables. The tests below change a profile value,
a study value, a recipe and the rows one at a time and show that each change fails."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest

from conformance import (DOC, PROCEDURE_ROW, ROOT, STUDY, TABLES, TableError, citation_problems, effective, load_table,
                         procedure_problems, problems, quotes, rehearsal_changes, render, tables)
from submission.profiles import PROFILES


def combined(path: Path) -> bool:
    return tomllib.loads(path.read_text()).get("line") == "both"


def shipped() -> list[Path]:
    """The profiles that reproduce a scored run, of both lines: the CPU demos (cpu-*, *-tiny) reproduce none, and a
    combined profile (line = "both") none either: the study ran the lines apart; its two profiles have their tables
    (test_a_combined_profile_runs_two_profiles_with_tables)."""
    return sorted(p for p in PROFILES.glob("*.toml")
                  if not p.stem.startswith("cpu-") and not p.stem.endswith("-tiny") and not combined(p))


def check(table) -> list[str]:
    return problems(table, *effective(table))


def edited(tmp_path: Path, name: str, old: str, new: str, **fields):
    """The table NAME with `old` replaced by `new` in its text (once, and it must be there), and `fields` set."""
    text = (TABLES / f"{name}.toml").read_text()
    assert text.count(old) == 1, old
    path = tmp_path / "tables" / f"{name}.toml"  # beside a profile copy of the same name
    path.parent.mkdir(exist_ok=True)
    path.write_text(text.replace(old, new))
    return dataclasses.replace(load_table(path), **fields)


def profile_copy(tmp_path: Path, name: str, old: str = "", new: str = "") -> str:
    text = (PROFILES / f"{name}.toml").read_text()
    assert not old or text.count(old) == 1, old
    path = tmp_path / f"{name}.toml"
    path.write_text(text.replace(old, new) if old else text)
    return str(path)


@pytest.mark.parametrize("name", [p.stem for p in sorted(TABLES.glob("*.toml"))])
def test_every_table_agrees_with_its_run(name):
    """rft-v1 reads training/rft.toml: without that file this fails, naming it."""
    table = load_table(TABLES / f"{name}.toml")
    assert check(table) == []


def test_every_shipped_profile_and_rft_v1_have_a_table():
    described = {t.profile for t in tables()} | {t.config for t in tables()}
    assert {p.stem for p in shipped()} | {"training/rft.toml"} <= described


@pytest.mark.parametrize("path", [p for p in PROFILES.glob("*.toml") if combined(p) and not p.stem.endswith("-tiny")],
                         ids=lambda p: p.stem)
def test_a_combined_profile_runs_two_profiles_with_tables(path):
    raw = tomllib.loads(path.read_text())
    described = {t.profile for t in tables()}
    for line in ("reasoning", "grid"):
        name = raw[line]["profile"]
        assert PROFILES / f"{name}.toml" in shipped(), f"{path}: {line}.profile {name} is not a shipped profile"
        assert name in described, f"{TABLES}: no table for {name}, which {path.stem} runs"


@pytest.mark.skipif(not STUDY.exists(), reason="../shared/design/STUDY.md is not beside this checkout")
def test_every_cited_line_is_in_study_md():
    assert [m for t in tables() for m in citation_problems(t, STUDY.read_text())] == []
    table = dataclasses.replace(load_table(TABLES / "moe-4xL4.toml"))
    bogus = dataclasses.replace(table, rows=(dataclasses.replace(table.rows[0], seed=(4470,)),))
    assert citation_problems(bogus, STUDY.read_text()) == ["moe-4xL4.toml: engine.kind: seed line 4470 is not in STUDY.md"]


@pytest.mark.skipif(not STUDY.exists(), reason="../shared/design/STUDY.md is not beside this checkout")
def test_a_row_citing_an_unrelated_line_fails(tmp_path):
    """max_num_seqs cites the MoE run's 64 sequences (4481-4482). Pointed at the sandbox's line (2498), its quote is not
    there; quoting that line's words instead, 64 cannot be read from them."""
    row = 'max_num_seqs = { study = 64, seed = [4481, 4482], quote = "a server limit of 64 sequences" }'
    moved = edited(tmp_path, "moe-4xL4", row, row.replace("[4481, 4482]", "[2498]"))
    assert citation_problems(moved, STUDY.read_text()) == [
        "moe-4xL4.toml: engine.max_num_seqs: the quote 'a server limit of 64 sequences' is not in STUDY.md lines "
        "[2498]"]
    requoted = edited(tmp_path, "moe-4xL4", row, row.replace("[4481, 4482]", "[2498]").replace(
        "a server limit of 64 sequences", "(10 s CPU, 1 GiB)"))
    assert citation_problems(requoted, STUDY.read_text()) == [
        "moe-4xL4.toml: engine.max_num_seqs: the study value 64 cannot be read from the quote '(10 s CPU, 1 GiB)': "
        "quote the words that give it, or say how they do (reading)"]


@pytest.mark.skipif(not STUDY.exists(), reason="../shared/design/STUDY.md is not beside this checkout")
def test_the_same_wrong_value_in_a_profile_and_its_table_fails(tmp_path):
    """48 sequences written into both the MoE profile and its table: the run agrees with the table, but the study's
    words ("a server limit of 64 sequences") do not give 48."""
    table = edited(tmp_path, "moe-4xL4", "max_num_seqs = { study = 64,", "max_num_seqs = { study = 48,",
                   profile=profile_copy(tmp_path, "moe-4xL4", "max_num_seqs = 64", "max_num_seqs = 48"))
    assert check(table) == []
    assert citation_problems(table, STUDY.read_text()) == [
        "moe-4xL4.toml: engine.max_num_seqs: the study value 48 cannot be read from the quote 'a server limit of 64 "
        "sequences': quote the words that give it, or say how they do (reading)"]


@pytest.mark.skipif(not STUDY.exists(), reason="../shared/design/STUDY.md is not beside this checkout")
def test_a_value_copied_from_another_run_fails(tmp_path):
    """The MoE run's 64 sequences written into the dense profile and its table with the MoE run's own lines and words
    (4481-4482, "a server limit of 64 sequences"): the run agrees with the table, the quote is in its lines and gives
    64, so the earlier checks passed it (run once on the code before `passages`: no problem found). The lines lie
    outside the 44.03 run's passages, and the row does not say why they would give its value."""
    row = 'max_num_seqs = { study = 36, seed = [4464], quote = "36 sequences" }'
    moe = 'max_num_seqs = { study = 64, seed = [4481, 4482], quote = "a server limit of 64 sequences" }'
    table = edited(tmp_path, "dense-27b-4xL4", row, moe,
                   profile=profile_copy(tmp_path, "dense-27b-4xL4", "max_num_seqs = 36", "max_num_seqs = 64"))
    assert check(table) == []
    assert citation_problems(table, STUDY.read_text()) == [
        "dense-27b-4xL4.toml: engine.max_num_seqs: the quote 'a server limit of 64 sequences' is from STUDY.md "
        "[4481, 4482], outside this run's passages (2288-2348, 2484-2500, 4453-4468): cite the run's own lines, or say "
        "why these words give its value (borrowed)"]


@pytest.mark.skipif(not STUDY.exists(), reason="../shared/design/STUDY.md is not beside this checkout")
def test_a_borrowed_row_that_quotes_its_own_run_is_stale(tmp_path):
    row = 'max_num_seqs = { study = 36, seed = [4464], quote = "36 sequences" }'
    table = edited(tmp_path, "dense-27b-4xL4", row, row[:-2] + ', borrowed = "the MoE run\'s" }')
    assert citation_problems(table, STUDY.read_text()) == [
        "dense-27b-4xL4.toml: engine.max_num_seqs: the quote is from this run's passages (2288-2348, 2484-2500, "
        "4453-4468) but the row says it is borrowed: remove borrowed"]


@pytest.mark.parametrize("passages", ["", "passages = []\n", "passages = [[4471]]\n", "passages = [[4504, 4471]]\n"])
def test_a_table_names_its_runs_passages(tmp_path, passages):
    path = tmp_path / "bad.toml"
    path.write_text(f'profile = "moe-4xL4"\n{passages}[engine]\nkind = {{ study = "vllm", seed = [4472] }}\n')
    with pytest.raises(TableError, match=f"{path}: passages: the STUDY.md line ranges"):
        load_table(path)


@pytest.mark.skipif(not STUDY.exists(), reason="../shared/design/STUDY.md is not beside this checkout")
def test_a_cited_row_needs_a_quote_and_a_quote_needs_its_lines(tmp_path):
    row = 'max_num_seqs = { study = 64, seed = [4481, 4482], quote = "a server limit of 64 sequences" }'
    bare = edited(tmp_path, "moe-4xL4", row, 'max_num_seqs = { study = 64, seed = [4481, 4482] }')
    assert citation_problems(bare, STUDY.read_text()) == [
        "moe-4xL4.toml: engine.max_num_seqs: cites STUDY.md [4481, 4482] without the study's words (quote)"]
    unsourced = edited(tmp_path, "moe-4xL4", row, 'max_num_seqs = { study = 64, spec = "5", quote = "64 sequences" }')
    assert citation_problems(unsourced, STUDY.read_text()) == [
        "moe-4xL4.toml: engine.max_num_seqs: a quote without the lines it is from (seed)"]


@pytest.mark.parametrize("quote, value", [
    ("+5 _._ 5%", 0.055), ("learning rate 10 _[−]_ [4],", 1e-4), ("5 _×_ 10 _[−]_ [5]", 5e-5),
    ("maximum model length 98,304", 98304), ("caps of 59,000 and 8,000.", 8000), ("a 56K cap", 56000),
    ("_B_ = 64 K,", 64000), ("new requests stop 15 minutes", 900.0), ("before the 12-hour limit", 43200.0),
    ("hard stop _L −_ 7 min;", 420.0), ("10% warm-up", 0.1), ("7.7 GiB reserved per GPU", 8267812044),
    ("(10 s CPU, 1 GiB)", 1024), ("three-token MTP", 3), ("(24K, then 16K unless", [24000, 16000]),
    ("with JSON grids", "json"), ("`xhigh`", "xhigh"),
])
def test_study_values_are_read_as_the_extraction_writes_them(quote, value):
    assert quotes.readable(value, quote)


@pytest.mark.parametrize("quote, value", [
    ("+5 _._ 5%", 5.6), ("maximum model length 98,304", 98000), ("a 56K cap", 56), ("(24K, then 16K", [24000, 8000]),
    ("custom all-reduce off", True), ("three-token MTP", 4), ("with JSON grids", "rows"),
])
def test_a_value_the_quote_does_not_give_is_not_read(quote, value):
    assert not quotes.readable(value, quote)


def test_docs_conformance_md_is_generated_from_the_tables():
    assert DOC.read_text() == render(), "docs/conformance.md is stale: run python -m conformance (make conformance)"


def read_test(path: str) -> str:
    return (ROOT / path).read_text()


def test_the_procedures_name_tests_that_exist():
    """Procedures are tested by behaviour: every row of docs/conformance/procedures.md names at least one test as
    `tests/FILE.py::NAME` (or `::NAME`, the file before it), and each exists."""
    text = (TABLES / "procedures.md").read_text()
    assert len(PROCEDURE_ROW.findall(text)) == 14 and procedure_problems(text, read_test) == []


def test_a_behaviour_row_whose_procedure_test_is_removed_fails():
    """The plain-view repair rule (Algorithm 5 L2) is a procedure row: its test deleted from the test file, or its
    name dropped from the row, fails."""
    text = (TABLES / "procedures.md").read_text()
    name = "test_repair_needs_a_plain_view_program_that_reproduces_a_demonstration"
    source = read_test("tests/test_procedures.py")
    assert source.count(f"def {name}(") == 1
    removed = source.replace(f"def {name}(", "def gone(")
    assert procedure_problems(text, lambda p: removed if p == "tests/test_procedures.py" else read_test(p)) == [
        f"procedures.md: 'repair turn queued after attempt 1 (MoE), after both attempts (dense), only if a plain-view "
        f"program reproduces a demonstration': tests/test_procedures.py::{name} is not defined"]
    row = next(line for line in text.splitlines() if name in line)
    untested = row[:row.rindex(" | ") + 3] + "by hand |"
    assert procedure_problems(text.replace(row, untested), read_test) == [
        "procedures.md: 'repair turn queued after attempt 1 (MoE), after both attempts (dense), only if a plain-view "
        "program reproduces a demonstration': names no test (tests/FILE.py::NAME)"]


def test_a_changed_profile_value_fails(tmp_path):
    table = load_table(TABLES / "moe-4xL4.toml")
    changed = dataclasses.replace(table, profile=profile_copy(
        tmp_path, "moe-4xL4", "mtp_speculative_tokens = 4", "mtp_speculative_tokens = 2"))
    assert check(changed) == [
        "moe-4xL4.toml: engine.mtp_speculative_tokens: the study has 4, the run 2, and the row gives no departure"]
    unstated = dataclasses.replace(table, profile=profile_copy(
        tmp_path, "moe-4xL4", "answer_max_tokens = 4000", "answer_max_tokens = 5000"))
    assert check(unstated) == ["moe-4xL4.toml: engine.answer_max_tokens: the table records the kit's 4000, the run has "
                               "5000"]


def test_a_setting_that_falls_back_to_its_default_fails(tmp_path):
    """Deleting a line from a profile is a change too: the default (24K then 16K repair caps) is not the study's."""
    table = load_table(TABLES / "moe-4xL4.toml")
    dropped = dataclasses.replace(table, profile=profile_copy(tmp_path, "moe-4xL4", "repair_caps = [16000]", ""))
    assert check(dropped) == ["moe-4xL4.toml: schedule.repair_caps: the study has [16000], the run [24000, 16000], "
                              "and the row gives no departure"]


def test_a_changed_study_value_fails(tmp_path):
    table = edited(tmp_path, "moe-4xL4", "max_num_seqs = { study = 64,", "max_num_seqs = { study = 48,")
    assert check(table) == [
        "moe-4xL4.toml: engine.max_num_seqs: the study has 48, the run 64, and the row gives no departure"]


def test_a_departure_on_a_matching_row_is_stale(tmp_path):
    table = edited(tmp_path, "moe-4xL4", "max_num_seqs = { study = 64,",
                   'max_num_seqs = { departure = "no longer true", study = 64,')
    assert check(table) == ["moe-4xL4.toml: engine.max_num_seqs: matches the study (64) but keeps a departure: "
                            "remove it"]


def test_a_removed_or_added_row_fails(tmp_path):
    removed = edited(tmp_path, "moe-4xL4", 'max_num_seqs = { study = 64, seed = [4481, 4482], quote = "a server limit of '
                                           '64 sequences" }\n', "")
    assert check(removed) == ["moe-4xL4.toml: engine.max_num_seqs: a setting without a row (the run has 64)"]
    added = edited(tmp_path, "moe-4xL4", "[sandbox]\n", '[sandbox]\nnice = { study = 5, seed = [2498] }\n')
    assert check(added) == ["moe-4xL4.toml: sandbox.nice: names no setting of the run"]
    feature = edited(tmp_path, "moe-4xL4", 'kit_setting = "engine.draft_sample_method"',
                     'kit_setting = "engine.draft_method"')
    assert check(feature) == ["moe-4xL4.toml: feature.draft_option: kit_setting 'engine.draft_method' is no setting "
                              "of the run"]


def test_a_changed_recipe_fails(tmp_path):
    """The weights are rows too: a module group given another scheme, or a rule no row exercises, fails."""
    recipe = (ROOT / "build/recipes/dense-27b-4xL4.toml").read_text()
    changed = tmp_path / "recipe.toml"
    changed.write_text(recipe.replace("layers = [0, 55]\nscheme = \"NVFP4A16\"", "layers = [0, 55]\nscheme = \"BF16\"")
                       + "\n[[rules]]\npattern = '\\.mlp\\.shared_expert\\.up_proj$'\nscheme = \"FP8_DYNAMIC\"\n")
    profile = profile_copy(tmp_path, "dense-27b-4xL4", 'recipe = "build/recipes/dense-27b-4xL4.toml"',
                           f'recipe = "{changed}"')
    table = edited(tmp_path, "dense-27b-4xL4", 'kit = "build/recipes/dense-27b-4xL4.toml"', f'kit = "{changed}"',
                   profile=profile)
    assert check(table) == [
        "dense-27b-4xL4.toml: recipe.mlp: the study has \"NVFP4A16\", the run \"BF16\", and the row gives no departure",
        "dense-27b-4xL4.toml: recipe: rules[5] (\\.mlp\\.shared_expert\\.up_proj$ -> FP8_DYNAMIC) matches no row's "
        "module"]


def test_a_grid_profile_value_fails_and_its_defaults_are_rows(tmp_path):
    table = load_table(TABLES / "grid-4b-4xL4.toml")
    changed = dataclasses.replace(table, profile=profile_copy(tmp_path, "grid-4b-4xL4", "cutoff = 0.2", "cutoff = 0.3"))
    assert check(changed) == [
        "grid-4b-4xL4.toml: search.cutoff: the study has 0.2, the run 0.3, and the row gives no departure"]
    same_default = dataclasses.replace(table, profile=profile_copy(tmp_path, "grid-4b-4xL4", "max_failures = 3", ""))
    assert check(same_default) == []  # the default is 3: the run does not change
    threads = dataclasses.replace(table, profile=profile_copy(tmp_path, "grid-4b-4xL4", "max_failures = 3",
                                                              "max_failures = 3\nthreads = 2"))
    assert check(threads) == ["grid-4b-4xL4.toml: run.threads: the table records the kit's 0, the run has 2"]


def test_the_rft_table_checks_a_training_config(tmp_path):
    """RFT v1's table against a training config written from the table itself: it agrees; a changed learning rate or
    loss slice fails."""
    table = load_table(TABLES / "rft-v1.toml")
    lines, corpus = [], []
    for row in table.rows:
        section, key = row.setting.split(".")
        value = row.study if row.study is not None else row.kit
        (lines if section == "train" else corpus).append(f"{key} = {tomllib_value(value)}")
    config = tmp_path / "rft.toml"
    config.write_text("\n".join(lines + ["[corpus]"] + corpus) + "\n")
    table = dataclasses.replace(table, config=str(config))
    assert check(table) == []
    config.write_text(config.read_text().replace("loss_chunk = 2048", "loss_chunk = 4096"))
    assert check(table) == [
        "rft-v1.toml: train.loss_chunk: the study has 2048, the run 4096, and the row gives no departure"]
    config.write_text(config.read_text().replace("lr = 0.0001", "lr = 0.0002"))
    assert "rft-v1.toml: train.lr: the study has 0.0001, the run 0.0002, and the row gives no departure" in check(table)


def tomllib_value(value) -> str:
    from submission.strict_toml import value as toml_value

    return toml_value(value)


@pytest.mark.parametrize("row, message", [
    ('kind = { study = "vllm" }', "engine.kind: a study value needs its source"),
    ('kind = { unstated = "why" }', "engine.kind: an unstated row records the kit's value as kit"),
    ('kind = { study = "vllm", seed = [1], unstated = "x", kit = "vllm" }', "engine.kind: give exactly one of"),
    ('kind = { study = "vllm", seed = [1], colour = 1 }', "engine.kind: unknown key(s) colour"),
    ('kind = "vllm"', "engine.kind: expected an inline table"),
    ('kind = { study = "vllm", seed = [1], kit = "vllm" }', "engine.kind: nearest and kit_setting belong to"),
    ('kind = { study = "vllm", seed = [1], module = "lm_head" }', "engine.kind: a [recipe] row, and only one,"),
    ('kind = { study = "vllm", seed = [1], borrowed = "why" }', "engine.kind: borrowed says why a quote from another"),
])
def test_a_malformed_row_is_refused_naming_the_file_and_the_setting(tmp_path, row, message):
    path = tmp_path / "bad.toml"
    path.write_text(f'profile = "moe-4xL4"\npassages = [[1, 2]]\n[engine]\n{row}\n')
    with pytest.raises(TableError, match=str(path)) as err:
        load_table(path)
    assert message in str(err.value)


@pytest.mark.parametrize("name", [p.stem for p in shipped()])
def test_the_rehearsal_scales_only_the_schedule_and_is_the_run_at_12_hours(name):
    """--scale-schedule (the commit run's rehearsal) changes time limits, margins and token caps only: the rate, the
    concurrency, the order of second attempts, the engine, the agent and the grid line's workers stay the scored
    run's; and scaled to the full 12 hours it is the scored run exactly."""
    table = next(t for t in tables() if t.profile == name)
    assert rehearsal_changes(table, 43200.0) == {}
    changed = rehearsal_changes(table, 1800.0)
    assert changed and {k.split(".")[0] for k in changed} <= {"schedule", "run"}
    assert not set(changed) & {"schedule.rate_tok_s", "schedule.max_in_flight", "schedule.second_by_confidence",
                               "run.devices", "run.max_len", "run.max_failures", "run.answer_room"}
    assert all(isinstance(a, (int, float, list)) for a, _ in changed.values())


def test_the_grid_runs_deadline_is_a_declared_departure():
    """The 33.06 run's global deadline was 12 hours plus 10 minutes (study ~1692-1695), a stop 600 s after the
    limit; the kit's grid profile stops 7 minutes before it, and says so as a departure, not as the study's value."""
    table = load_table(TABLES / "grid-4b-4xL4.toml")
    row = next(r for r in table.rows if r.setting == "run.hard_stop_margin_s")
    assert (row.study, row.seed) == (-600.0, (1692, 1695)) and row.departure
    assert effective(table)[0]["run.hard_stop_margin_s"] == 420.0
