"""training/corpus: SEQUENTIAL, SELECT and PARALLEL composites (typing, oracle, panel inputs, materiality of every
component, admission) and generate's depths, workers and resume after a kill."""

from __future__ import annotations

import importlib
import json

import numpy as np
import pytest

from submission.tasks import load_tasks
from training.corpus import admission, compose, dsl, gate, generate, oracle, panels, rules, scenes, store
from training.corpus.compose import Parallel, Select, Sequential
from training.corpus.family_count import CountPack
from training.corpus.family_rays import Rays
from training.corpus.family_symmetry import SymmetryRepair

RIGHT, DOWN = Rays("right", "wall", "mark"), Rays("down", "wall", "mark")
CHAIN = Sequential(RIGHT, CountPack("any", "row", "mark", 8))
CHOICE = Select("wider_than_tall", RIGHT, DOWN)
PAIRED = Parallel(RIGHT, DOWN, "side")


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


def test_a_parallel_runs_each_component_on_its_panel_and_joins_the_outputs():
    # key [bg 0, mark 3, divider 7]; left panel: a source before a wall; right panel: a source above a wall
    grid = np.array([[0, 3, 7, 0, 0, 0, 0],
                     [3, 0, 5, 7, 3, 0, 0],
                     [0, 0, 0, 7, 0, 0, 0],
                     [0, 0, 0, 7, 5, 0, 0]])
    assert rules.run(PAIRED, grid).tolist() == [[3, 3, 5, 7, 3, 0, 0],
                                                [0, 0, 0, 7, 3, 0, 0],
                                                [0, 0, 0, 7, 5, 0, 0]]
    with pytest.raises(oracle.BadKey):  # a single rule reads [bg, mark, bg...]: panel inputs are not its kind
        rules.run(RIGHT, grid)
    with pytest.raises(oracle.Unjoinable):  # outputs of 2 x 2 and 2 x 3 cells cannot be stacked
        rules.run(Parallel(RIGHT, DOWN, "stack"),
                  np.array([[0, 3, 7, 0, 0, 0], [3, 0, 7, 3, 0, 0], [0, 0, 7, 0, 0, 0]]))
    # on generated panels: the joined output is each component's output on its own panel, a divider between them
    rng = np.random.default_rng(3)
    for axis in panels.AXES:
        program = Parallel(Rays("cross", "border", "hit"), Rays("diagonal", "wall", "mark"), axis)
        x, y = rules.propose(program, rng)
        bg, mark, div = (int(v) for v in x[0, :3])
        body = x[1:] if axis == "side" else x[1:].T
        at = int(np.flatnonzero((body == div).all(axis=0))[0])
        parts = [body[:, :at], body[:, at + 1:]]
        if axis == "stack":
            parts = [p.T for p in parts]
        outs = [rules.run(c, scenes.with_key(p, bg, mark)) for c, p in zip((program.first, program.second), parts)]
        line = np.full((outs[0].shape[0], 1) if axis == "side" else (1, outs[0].shape[1]), div)
        assert np.array_equal(y, np.concatenate([outs[0], line, outs[1]], axis=1 if axis == "side" else 0))


def test_parallel_composites_are_typed_and_round_trip():
    for program in (PAIRED, Parallel(CHAIN, CountPack("any", "row", "mark", 4), "stack"),
                    Parallel(CHOICE, RIGHT, "side")):
        assert rules.from_dict(json.loads(dsl.canonical_json(program))) == program
    assert compose.depth(Parallel(CHAIN, RIGHT, "side")) == 3 and PAIRED.produces == "crop"
    for make in (lambda: Select("mark_in_body", PAIRED, RIGHT), lambda: Sequential(RIGHT, PAIRED),
                 lambda: Parallel(PAIRED, RIGHT, "side")):
        with pytest.raises(dsl.ProgramError, match="reads panels"):
            make()
    with pytest.raises(dsl.ProgramError, match=r"^m: join"):
        rules.from_dict(dict(PAIRED.to_dict(), join="diagonal"), "m")
    # the other join, then each component's variants
    assert len(PAIRED.variants()) == 1 + len(RIGHT.variants()) + len(DOWN.variants())
    assert [name for name, _ in PAIRED.dropped()] == ["first", "second"]


def test_a_parallel_whose_component_does_nothing_on_the_task_is_rejected(probes):
    # every first panel's source sits on its right edge: RIGHT draws nothing there, so dropping it changes nothing
    rng, pairs = np.random.default_rng(0), []
    while len(pairs) < 6:
        bg, mark, _, axis, first, second = panels.split(rules.propose(PAIRED, rng)[0])
        if axis != "side":
            continue
        first = np.where(first == mark, bg, first)
        first[int(rng.integers(first.shape[0])), -1] = mark
        x = panels.panel_scene(scenes.with_key(first, bg, mark), scenes.with_key(second, bg, mark), "side", rng)
        pairs.append((x, rules.run(PAIRED, x)))
        assert np.array_equal(rules.run(Parallel(compose.IDENTITY, DOWN, "side"), x), pairs[-1][1])
    assert len({y.shape for _, y in pairs}) >= 2
    report = gate.judge_task(PAIRED, pairs, probes)
    assert (report.reason, report.detail) == ("immaterial", "dropping first changes fewer than 2 outputs")
    pairs = gate.make_task(PAIRED, np.random.default_rng(0), probes)
    assert gate.judge_task(PAIRED, pairs, probes).accepted  # the same rule on proposed scenes is material


def test_the_probe_bank_has_panels_on_which_parallels_are_admitted(probes):
    n_panels = len(rules.FAMILIES) ** 2 * rules.PANEL_PROBES
    panel_slots = [i for i, p in enumerate(probes) if p.shape[1] > 2 and p[0, 2] != p[0, 0]]
    assert panel_slots == list(range(len(probes) - n_panels, len(probes)))
    # single rules refuse every panel (BadKey): the panels change nothing in their behaviours
    assert set(admission.raw_behaviour(RIGHT, probes)[panel_slots]) == {admission.error_code(oracle.BadKey())}
    adm = admission.Admitter(len(probes))
    candidates = [Parallel(RIGHT, DOWN, "side"), Parallel(RIGHT, DOWN, "stack"),
                  Parallel(CountPack("any", "row", "mark", 8), CountPack("holed", "row", "mark", 4), "side")]
    assert [admission.admit_program(adm, p, probes).reason for p in candidates] == ["admitted"] * 3
    # a repaired template (a scene) beside a row of tiles (a crop) never fits side by side: no valid slot
    mixed = Parallel(SymmetryRepair("lr", "mark", "repaired"), CountPack("any", "row", "mark", 8), "side")
    assert (admission.raw_behaviour(mixed, probes) >= 0).sum() < admission.MIN_VALID


PROGRAMS = [Rays("right", "wall", "mark"), Rays("cross", "wall", "mark"), SymmetryRepair("lr", "mark", "repaired")]


def _files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_generate_reports_depths_and_a_killed_run_resumes_to_the_same_bytes(tmp_path, monkeypatch):
    whole = tmp_path / "whole"
    counts = generate.generate(2, 1, 0, whole, tries=1, programs=PROGRAMS, depth=2)
    report = json.loads((whole / "gate.json").read_text())
    assert set(report["by_depth"]) == {"1", "2"} and report["rules"] == 4
    assert sum(report["by_depth"]["1"]["admission"].values()) >= 2
    rows = [json.loads(line) for line in (whole / "manifest.jsonl").read_text().splitlines()]
    assert len(rows) == counts["accepted"] and {r["depth"] for r in rows} <= {1, 2}
    paired = [r for r in rows if r["family"] == "parallel"]
    assert paired  # a PARALLEL composite's task, which replays through the oracle and passes the gate again
    task = json.loads((whole / "tasks" / f"{paired[0]['task']}.json").read_text())
    pairs = [(np.array(p["input"]), np.array(p["output"])) for p in task["train"] + task["test"]]
    assert gate.judge_task(rules.from_dict(paired[0]["rule"]), pairs, rules.probe_bank()).accepted
    assert (whole / "corpus.png").read_bytes()[:4] == b"\x89PNG"
    # the task folder is a task source where the kit consumes tasks (training.traces, training.calibration_traces,
    # grid_tune)
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
    with pytest.raises(store.CorpusError, match="unfinished"):  # other arguments wait until this run is finished
        generate.generate(3, 1, 0, killed, tries=1, programs=PROGRAMS, depth=2)
    monkeypatch.setattr(generate, "_gate_rule", real_gate)
    measured = []
    monkeypatch.setattr(generate, "_measure", lambda p: measured.append(p) or real_measure(p))
    generate.generate(2, 1, 0, killed, tries=1, programs=PROGRAMS, depth=2)
    assert measured == []  # admission was finished and checkpointed: nothing measured again
    assert len(list((killed / "progress" / "gated").glob("*.json"))) == 4
    assert _files(killed) == _files(whole)


def test_a_finished_corpus_grows_with_a_new_seed_keeping_every_file_it_had(tmp_path):
    out = tmp_path / "grown"
    generate.generate(2, 1, 0, out, tries=1, programs=PROGRAMS, depth=2)
    before = _files(out)
    old_rows = (out / "manifest.jsonl").read_text().splitlines()
    generate.generate(2, 1, 1, out, tries=1, families=["rays", "count_pack"], depth=1)  # a new seed, other families
    report = json.loads((out / "gate.json").read_text())
    assert report["runs"] == 2 and report["rules"] == 6
    rows = (out / "manifest.jsonl").read_text().splitlines()
    assert rows[:len(old_rows)] == old_rows and len(rows) > len(old_rows)  # the old manifest, then the new tasks
    after = _files(out)
    for name, data in before.items():
        if name.parts[0] in ("tasks", "heldout") or name.parts[:2] in (("progress", "gated"), ("progress", "admit")):
            assert after[name] == data, name  # grown by appending: no task or shard rewritten
    ids = [json.loads(r)["rule_id"] for r in rows]
    assert len(set(ids)) == 6  # the new run admitted no rule of the old one again
    generate.generate(2, 1, 1, out, tries=1, families=["rays", "count_pack"])
    assert _files(out) == after  # the same arguments again: nothing to do, same bytes
    generate.generate(3, 1, 0, out, tries=1, programs=PROGRAMS, depth=2)  # the first run's arguments, more rules
    report = json.loads((out / "gate.json").read_text())
    admitted = [dsl.rule_id(rules.from_dict(r)) for entry in sorted((out / "progress" / "admit").glob("*.json"))
                for r in json.loads(entry.read_text())["rules"]]
    assert report["runs"] == 3 and report["rules"] == len(admitted) > 6
    assert len(set(admitted)) == len(admitted)  # no rule admitted twice
    assert all(_files(out)[name] == data for name, data in after.items() if name.parts[0] in ("tasks", "heldout"))


def test_a_composite_and_the_rules_it_holds_are_each_others_rivals(probes):
    """The audit's finding at --rules 56: a single rule's task whose inputs all take one SELECT branch, that rule, is
    solved by the SELECT too, yet the SELECT was not among the rule's 8 nearest admitted rules, so the gate never
    tried it. Kin (compose.kin) are rivals at any distance, in generate and in the audit alike."""
    other = CountPack("any", "row", "mark", 8)
    programs = [RIGHT, DOWN, CHOICE, other, CHAIN]
    assert compose.kin(programs) == [[2, 4], [2], [0, 1], [4], [0, 3]]
    assert compose.components(Sequential(CHOICE, DOWN)) == [CHOICE, RIGHT, DOWN, DOWN]
    by_id = {dsl.rule_id(p): p for p in programs}
    assert generate.rivals([dsl.rule_id(DOWN)], compose.kin(programs)[0], by_id, programs) == [DOWN, CHOICE, CHAIN]
    # a task of RIGHT whose inputs are all wider than tall: CHOICE takes its RIGHT branch on every pair
    pairs = [p for p in (rules.propose(RIGHT, np.random.default_rng(s)) for s in range(80))
             if rules.predicate("wider_than_tall", p[0])]
    pairs = [pairs[i] for i in sorted({x.tobytes(): i for i, (x, _) in enumerate(pairs)}.values())][:6]
    assert len(pairs) == 6
    assert gate._wrong_on(CHOICE, pairs) == 0
    report = gate.judge_task(RIGHT, pairs, probes, generate.rivals([], compose.kin(programs)[0], by_id, programs))
    assert report.reason == "not_separated" and dsl.canonical_json(CHOICE) in report.detail


def test_the_command_line_refuses_new_arguments_on_an_unfinished_run_with_exit_2(tmp_path, capsys):
    out = tmp_path / "c"
    (out / "progress" / "segments").mkdir(parents=True)
    (out / "progress" / "segments" / "000.json").write_text(json.dumps({"rules": 9}))  # a run that admitted nothing
    cli = importlib.import_module("training.corpus.__main__")
    with pytest.raises(SystemExit) as stop:
        cli.main(["generate", "--families", "rays", "--rules", "1", "--workers", "0", "--out", str(out)])
    assert stop.value.code == 2
    assert f"error: {out}: its last run ({out / 'progress' / 'segments' / '000.json'}) is unfinished" in \
        capsys.readouterr().err
    (out / "progress" / "admission.json").write_text("{}")  # issue 19's checkpoint, rewritten whole: not resumed
    with pytest.raises(store.CorpusError, match="written by an older generate"):
        generate.generate(1, 1, 0, out, families=["rays"])
