"""training/corpus audit: a clean corpus passes; a planted ARC-AGI-2 evaluation pair (turned, recoloured) is caught."""

from __future__ import annotations

import importlib
import json
import shutil

import numpy as np
import pytest

from training.corpus import audit, generate
from training.corpus.dsl import MaskOp, SelectMaskRender, Selector

PROGRAM = SelectMaskRender(Selector("size", "max"), MaskOp("dilate", 1), (), "crop_mask", 8)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    out = tmp_path_factory.mktemp("corpus")
    assert generate.generate(1, 1, 0, out, tries=2, programs=[PROGRAM])["accepted"] == 1
    return out


@pytest.fixture(scope="module")
def evaluation(arc_data):
    return arc_data / "arc-agi-2" / "evaluation"


def test_a_clean_corpus_passes_the_audit(corpus, evaluation):
    assert audit.audit(corpus, evaluation) == []


def test_a_planted_evaluation_pair_is_caught_under_symmetry_and_recolouring(corpus, evaluation, tmp_path):
    planted = tmp_path / "planted"
    shutil.copytree(corpus, planted)
    source = sorted(evaluation.glob("*.json"))[7]
    x, y = audit.load_pairs(source)[0]
    recolour = np.array([4, 9, 0, 7, 1, 8, 2, 6, 3, 5], dtype=np.int8)
    leaked = {"input": recolour[np.rot90(x)].tolist(), "output": recolour[np.rot90(y)].tolist()}
    task_file = next((planted / "tasks").glob("*.json"))
    task = json.loads(task_file.read_text())
    task["train"][2] = leaked
    task_file.write_text(json.dumps(task))

    findings = audit.audit(planted, evaluation)
    kinds = {f.kind for f in findings}
    assert {"pair", "input", "replay"} <= kinds
    pair = next(f for f in findings if f.kind == "pair")
    assert pair.detail == f"pair 2 matches {source.name}"

    cli = importlib.import_module("training.corpus.__main__")
    with pytest.raises(SystemExit) as stop:
        cli.main(["audit", str(planted), "--arc-data", str(evaluation), "--workers", "0"])  # no Ray in this env
    assert stop.value.code == 1


def test_a_rule_with_tasks_in_both_splits_is_a_finding(corpus, evaluation, tmp_path):
    mixed = tmp_path / "mixed"
    shutil.copytree(corpus, mixed)
    row = json.loads((mixed / "manifest.jsonl").read_text())
    task = (mixed / "tasks" / f"{row['task']}.json").read_text()
    (mixed / "heldout" / f"{row['rule_id']}-9.json").write_text(task)
    twin = dict(row, task=f"{row['rule_id']}-9", split="heldout")
    (mixed / "manifest.jsonl").write_text(json.dumps(row) + "\n" + json.dumps(twin) + "\n")
    findings = audit.audit(mixed, evaluation)
    assert [(f.task, f.kind) for f in findings] == [(row["rule_id"], "split")]
