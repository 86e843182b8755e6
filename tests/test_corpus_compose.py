"""training/corpus: SEQUENTIAL and SELECT composites (typing, oracle, materiality of every component) and
generate's depths, workers and resume after a kill."""

from __future__ import annotations

import json

import numpy as np
import pytest

from submission.tasks import load_tasks
from training.corpus import compose, dsl, gate, generate, oracle, rules, scenes
from training.corpus.compose import Select, Sequential
from training.corpus.family_count import CountPack
from training.corpus.family_rays import Rays
from training.corpus.family_symmetry import SymmetryRepair

RIGHT, DOWN = Rays("right", "wall", "mark"), Rays("down", "wall", "mark")
CHAIN = Sequential(RIGHT, CountPack("any", "row", "mark", 8))
CHOICE = Select("wider_than_tall", RIGHT, DOWN)


@pytest.fixture(scope="module")
def probes():
    return rules.probe_bank()


def test_composites_round_trip_and_are_typed():
    for program in (CHAIN, CHOICE, Sequential(CHOICE, SymmetryRepair("lr", "mark", "patch"))):
        assert rules.from_dict(json.loads(dsl.canonical_json(program))) == program
    assert compose.depth(CHAIN) == 2 and compose.depth(Sequential(CHOICE, RIGHT)) == 3
    with pytest.raises(dsl.ProgramError, match="count_pack rule that produces a crop"):
        Sequential(CountPack("any", "row", "mark", 8), RIGHT)  # a row of tiles is not a scene to shoot rays in
    with pytest.raises(dsl.ProgramError, match=r"^m: then\.?.*directions"):
        rules.from_dict({"family": "sequential", "first": RIGHT.to_dict(),
                         "then": dict(RIGHT.to_dict(), directions="sideways")}, "m")
    assert all(not (isinstance(v, Sequential) and v.first.produces != "scene") for v in CHAIN.variants())
    # other predicates, then each branch's variants, less the two that make both branches the same rule
    assert len(CHOICE.variants()) == len(compose.PREDICATES) - 1 + 2 * len(RIGHT.variants()) - 2


def test_the_oracle_runs_components_in_order_and_selects_by_the_predicate():
    wide = scenes.with_key(np.array([[3, 0, 5, 0, 3, 0]]), 0, 3)
    # rays right: [3, 3, 5, 0, 3, 3]; keyed again, counted 8-connected: two objects
    assert rules.run(CHAIN, wide).tolist() == [[3, 3]]
    assert rules.run(CHOICE, wide).tolist() == [[3, 3, 5, 0, 3, 3]]
    tall = scenes.with_key(np.array([[3, 0], [0, 0], [5, 0]]), 0, 3)
    assert rules.run(CHOICE, tall).tolist() == [[3, 0], [3, 0], [5, 0]]
    with pytest.raises(oracle.NoObjects):
        rules.run(CHAIN, scenes.with_key(np.array([[0, 0, 5]]), 0, 3))


def test_composite_tasks_pass_the_gate(probes):
    for program in (CHAIN, CHOICE):
        pairs = gate.make_task(program, np.random.default_rng(0), probes)
        assert gate.judge_task(program, pairs, probes).accepted
        for name, without in program.dropped():
            assert gate._wrong_on(without, pairs) >= gate.MIN_WRONG, name


def test_a_composite_with_an_immaterial_component_is_rejected(probes):
    # every input is wider than tall: the if_false branch is never used, dropping it changes nothing
    pairs = [p for p in (rules.propose(CHOICE, np.random.default_rng(s)) for s in range(60))
             if rules.predicate("wider_than_tall", p[0])]
    pairs = [pairs[i] for i in sorted({x.tobytes(): i for i, (x, _) in enumerate(pairs)}.values())][:6]
    assert len(pairs) == 6 and len({y.shape for _, y in pairs}) >= 2
    report = gate.judge_task(CHOICE, pairs, probes)
    assert (report.reason, report.detail) == ("immaterial", "dropping if_false changes fewer than 2 outputs")


PROGRAMS = [Rays("right", "wall", "mark"), Rays("cross", "wall", "mark"), SymmetryRepair("lr", "mark", "repaired")]


def _files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_generate_reports_depths_and_a_killed_run_resumes_to_the_same_bytes(tmp_path, monkeypatch):
    whole = tmp_path / "whole"
    counts = generate.generate(2, 1, 0, whole, tries=1, programs=PROGRAMS, depth=2, workers=2)
    report = json.loads((whole / "gate.json").read_text())
    assert set(report["by_depth"]) == {"1", "2"} and report["rules"] == 4
    assert sum(report["by_depth"]["1"]["admission"].values()) >= 2
    rows = [json.loads(line) for line in (whole / "manifest.jsonl").read_text().splitlines()]
    assert len(rows) == counts["accepted"] and {r["depth"] for r in rows} <= {1, 2}
    assert (whole / "corpus.png").read_bytes()[:4] == b"\x89PNG"
    # the task folder is a task source where the kit consumes tasks (training.traces, build.traces, grid_tune)
    loaded = load_tasks(whole / "tasks")
    assert not loaded.errors and sorted(t.id for t in loaded.tasks) == sorted(r["task"] for r in rows)
    assert all(len(t.train) == 5 and t.test_outputs is not None for t in loaded.tasks)

    killed = tmp_path / "killed"
    real_gate, real_measure, calls = generate._gate_rule, generate._measure, []

    def dies_on_the_third_rule(job):
        calls.append(dsl.rule_id(job[0]))
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real_gate(job)

    monkeypatch.setattr(generate, "_gate_rule", dies_on_the_third_rule)
    with pytest.raises(KeyboardInterrupt):
        generate.generate(2, 1, 0, killed, tries=1, programs=PROGRAMS, depth=2)
    assert not (killed / "manifest.jsonl").exists()
    monkeypatch.setattr(generate, "_gate_rule", real_gate)
    measured = []
    monkeypatch.setattr(generate, "_measure", lambda p: measured.append(p) or real_measure(p))
    generate.generate(2, 1, 0, killed, tries=1, programs=PROGRAMS, depth=2)
    assert measured == []  # admission was finished and checkpointed: nothing measured again
    assert len(list((killed / "progress" / "gated").glob("*.json"))) == 4
    assert _files(killed) == _files(whole)
    with pytest.raises(SystemExit, match="other arguments"):
        generate.generate(3, 1, 0, killed, tries=1, programs=PROGRAMS, depth=2)
