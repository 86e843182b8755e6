"""training/corpus curriculum: a difficulty-filtered sample of a generated corpus, and the check that guards it."""

from __future__ import annotations

import json

import pytest

from training.corpus import curriculum, difficulty, generate
from training.corpus.family_count import CountPack
from training.corpus.family_gravity import Gravity
from training.corpus.family_rays import Rays
from training.corpus.family_recolour import Recolour

# three rules among the cheap solver's first 300 (two operations each) and one beyond them (three)
PROGRAMS = [Gravity("down", "object", "all"), Recolour("height", "unique", "erase", 4),
            Rays("horizontal", "wall", "hit"), CountPack("single_cell", "square", "colour", 8)]
FAMILIES = sorted({p.family for p in PROGRAMS})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus")
    generate.generate(4, 1, 0, out, tries=2, programs=PROGRAMS)
    return out


@pytest.fixture(scope="module")
def sample(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("sample") / "s"
    assert curriculum.main(["sample", "--corpus", str(corpus), "--out", str(out), "--tasks", "6"]) == 0
    return out


def test_a_sample_has_no_weak_test_pair_and_nothing_beyond_its_filter(sample, capsys):
    rows = [json.loads(line) for line in (sample / "curriculum.jsonl").read_text().splitlines()]
    assert 4 <= len(rows) <= 6
    assert [(r["level"], r["operations"], r["task"]) for r in rows] == sorted(
        (r["level"], r["operations"], r["task"]) for r in rows)
    assert {r["family"] for r in rows} <= set(FAMILIES)
    for row in rows:
        task = json.loads((sample / "tasks" / f"{row['task']}.json").read_text())
        test = task["test"][0]
        assert test["output"] != [r for r in test["input"][1:]]  # not a no-op
        assert len(test["output"]) * len(test["output"][0]) > 1 or any(
            len(p["output"]) * len(p["output"][0]) == 1 for p in task["train"])
        assert row["level"] <= 3 and row["operations"] <= difficulty.Filter().max_operations
    assert curriculum.main(["check", str(sample)]) == 0
    assert "0 findings" in capsys.readouterr().out


def test_the_check_catches_a_no_op_test_pair_and_a_tighter_filter(sample, tmp_path, capsys):
    rows = [json.loads(line) for line in (sample / "curriculum.jsonl").read_text().splitlines()]
    broken = tmp_path / "broken"
    (broken / "tasks").mkdir(parents=True)
    for row in rows:
        (broken / "tasks" / f"{row['task']}.json").write_text((sample / "tasks" / f"{row['task']}.json").read_text())
    (broken / "curriculum.jsonl").write_text((sample / "curriculum.jsonl").read_text())
    summary = json.loads((sample / "sample.json").read_text())
    summary["filter"]["max_operations"] = 1  # every rule has at least one operation; some have two
    (broken / "sample.json").write_text(json.dumps(summary))
    name = rows[0]["task"]
    task = json.loads((broken / "tasks" / f"{name}.json").read_text())
    task["test"][0]["output"] = task["test"][0]["input"][1:]
    (broken / "tasks" / f"{name}.json").write_text(json.dumps(task))
    assert curriculum.main(["check", str(broken)]) == 1
    out = capsys.readouterr().out
    assert f"{name}: weak_test: the test output is its input unchanged" in out
    beyond = [r["task"] for r in rows[1:] if r["operations"] > 1]
    assert all(f"{t}: beyond_filter: " in out for t in beyond)


def test_bad_manifest_rows_name_the_file_and_the_field(tmp_path):
    (tmp_path / "manifest.jsonl").write_text('{"task": "x", "split": "train"}\n')
    with pytest.raises(curriculum.CurriculumError, match=r"manifest.jsonl:1: field 'rule' missing"):
        curriculum.read_corpus(tmp_path)  # a library error, not SystemExit: a caller's process goes on


def test_the_command_exits_2_naming_the_bad_file(tmp_path, capsys):
    (tmp_path / "manifest.jsonl").write_text('{"task": "x", "split": "train"}\n')
    assert curriculum.main(["sample", "--corpus", str(tmp_path), "--out", str(tmp_path / "out")]) == 2
    assert "manifest.jsonl:1: field 'rule' missing" in capsys.readouterr().err


def test_the_cheap_solver_infers_the_rules_within_its_budget_and_levels_follow(corpus):
    entries = curriculum.read_corpus(corpus)
    order = difficulty.search_order()
    measured = {e.rule: difficulty.measure(e.rule, e.pairs, order) for e in entries}
    assert len(measured) >= 3
    for rule, found in measured.items():
        assert found.depth == 1 and found.operations == (3 if rule == PROGRAMS[-1] else 2)
        assert (found.solver_pass >= 0.5) == (rule in order) and (found.level == 0) == (rule in order)
    assert PROGRAMS[-1] not in order and measured.get(PROGRAMS[-1], difficulty.Difficulty(1, 3, 0)).level == 2
