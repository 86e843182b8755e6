"""submission/kaggle/mounts.py: the competition's files are taken from the competition's own mount whatever else is
attached, an ambiguous choice fails the commit run (naming the paths) and is logged in the rerun, and the answer file
is kept complete task by task (issue 27: the 2024 data's 100-task file was taken for the 240-task test set, and one
task with another input count cost every task its answers)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from submission.kaggle.mounts import COMPETITION, TEST_FILE, choose, find, keep_complete, merged, zero_submission

ROOT = Path("/kaggle/input")


def at(*parts: str) -> Path:
    return ROOT.joinpath(*parts, TEST_FILE)


@pytest.mark.parametrize("rerun", [False, True])
def test_the_competitions_mount_wins_whatever_else_is_attached(rerun):
    found = [at("arc-prize-2024"), at(COMPETITION), at("someones-copy")]
    choice = choose(found, ROOT, COMPETITION, rerun, TEST_FILE)
    assert choice.path == at(COMPETITION) and not choice.refusal
    assert "also attached, not used" in choice.note and str(at("arc-prize-2024")) in choice.note


def test_a_newer_mount_layout_below_a_folder_still_counts_as_the_competitions():
    nested = ROOT / "competitions" / COMPETITION / TEST_FILE
    assert choose([at("arc-prize-2024"), nested], ROOT, COMPETITION, False, TEST_FILE).path == nested


def test_several_without_the_competitions_mount_refuse_the_commit_and_the_rerun_takes_the_newest():
    found = [at("arc-prize-2024"), at("arc-prize-2023")]
    commit = choose(found, ROOT, COMPETITION, False, TEST_FILE)
    assert commit.refusal and all(str(p) in commit.refusal for p in found)
    rerun = choose(found, ROOT, COMPETITION, True, TEST_FILE)
    assert rerun.path == at("arc-prize-2024") and not rerun.refusal and "ambiguous" in rerun.note


def test_one_file_elsewhere_is_taken_with_a_warning_and_none_is_said():
    only = choose([at("renamed")], ROOT, COMPETITION, False, TEST_FILE)
    assert only.path == at("renamed") and not only.refusal and "warning" in only.note
    assert choose([], ROOT, COMPETITION, False, TEST_FILE).path is None


def test_find_reads_the_tree(tmp_path):
    for slug in ("arc-prize-2024", COMPETITION):
        (tmp_path / slug).mkdir()
        (tmp_path / slug / TEST_FILE).write_text("{}")
    assert find(tmp_path, TEST_FILE, COMPETITION, False).path == tmp_path / COMPETITION / TEST_FILE
    assert find(tmp_path / "missing", TEST_FILE, COMPETITION, True).path is None


def test_a_task_without_test_inputs_gets_one_slot(tmp_path):
    (tmp_path / "c.json").write_text(json.dumps({"a": {"train": [], "test": [{}, {}]}, "b": {"train": []},
                                                 "c": {"train": [], "test": None}}))
    zero = zero_submission(tmp_path / "c.json")
    assert {t: len(s) for t, s in zero.items()} == {"a": 2, "b": 1, "c": 1}


def test_the_answer_file_is_merged_task_by_task():
    fallback = {"a": [{"attempt_1": [[0]], "attempt_2": [[0]]}], "b": [{"attempt_1": [[0]], "attempt_2": [[0]]}] * 2}
    good = {"attempt_1": [[1, 2]], "attempt_2": [[3, 4]]}
    written = {"a": [good], "b": [good]}  # b: one input of two
    out, replaced = merged(written, fallback)
    assert out["a"] == [good] and out["b"] == fallback["b"] and replaced == ["b"]
    for broken in ([[1, 2], [3]], [[10]], [], [[True]], None):  # ragged, colour 10, empty, a bool, no grid
        out, replaced = merged({"a": [{"attempt_1": broken, "attempt_2": [[0]]}], "b": [good, good]}, fallback)
        assert replaced == ["a"] and out["b"] == [good, good], broken
    assert merged("not a dict", fallback) == (fallback, ["a", "b"])


def test_keep_complete_writes_only_what_it_must(tmp_path):
    answer = tmp_path / "submission.json"
    fallback = {"a": [{"attempt_1": [[0]], "attempt_2": [[0]]}]}
    assert keep_complete(answer, fallback) == ["a"] and json.loads(answer.read_text()) == fallback
    assert answer.stat().st_mode & 0o044 == 0o044  # readable by all, as open() makes it (mkstemp: 0600)
    answer.write_text('{"a": [{"attempt_1": [[5]], "attempt_2": [[6]]}]}')
    assert keep_complete(answer, fallback) == [] and json.loads(answer.read_text())["a"][0]["attempt_1"] == [[5]]
    answer.write_text("{")
    assert keep_complete(answer, fallback) == ["a"] and json.loads(answer.read_text()) == fallback
