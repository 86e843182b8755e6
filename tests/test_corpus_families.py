"""training/corpus: the count-pack, symmetry-repair, rays, gravity, connect and recolour families (typed stages,
oracle, scenes, gate)."""

from __future__ import annotations

import doctest
import hashlib

import numpy as np
import pytest

from training.corpus import (admission, dsl, family_connect, family_count, family_gravity, family_rays, family_recolour,
                             family_symmetry, gate, oracle, rules, scenes)
from training.corpus.family_connect import Connect
from training.corpus.family_count import CountPack
from training.corpus.family_gravity import Gravity
from training.corpus.family_rays import Rays
from training.corpus.family_recolour import Recolour
from training.corpus.family_symmetry import SymmetryRepair

MODULES = {"count_pack": family_count, "symmetry_repair": family_symmetry, "rays": family_rays,
           "gravity": family_gravity, "connect": family_connect, "recolour": family_recolour}
SAMPLES = [CountPack("single_cell", "column", "mark", 4), SymmetryRepair("lr", "mark", "repaired"),
           Rays("right", "wall", "mark"), Gravity("down", "object", "mark"), Connect("both", "through", "own"),
           Recolour("size", "max", "erase", 8)]


@pytest.fixture(scope="module")
def probes():
    return rules.probe_bank()


@pytest.mark.parametrize("module", [family_count, family_symmetry, family_rays, family_gravity, family_connect,
                                    family_recolour, rules])
def test_every_operator_docstring_example_holds(module):
    result = doctest.testmod(module, optionflags=doctest.IGNORE_EXCEPTION_DETAIL)
    assert result.failed == 0 and result.attempted >= 1


def test_every_operator_has_a_docstring_example():
    for module, names in ((family_count, ("has_feature", "pack")), (family_symmetry, ("mirror", "repair")),
                          (family_rays, ("trace",)), (family_gravity, ("fall_cells", "fall_objects")),
                          (family_connect, ("points",)), (family_recolour, ("passing",)), (rules, ("predicate",))):
        for name in names:
            assert ">>>" in getattr(module, name).__doc__, name


@pytest.mark.parametrize("family", list(MODULES))
def test_every_rule_round_trips_through_canonical_json_and_variants_differ_in_one_node(family):
    programs = rules.all_programs(family)
    assert len({dsl.rule_id(p) for p in programs}) == len(programs) >= 16
    for program in programs:
        text = dsl.canonical_json(program)
        assert dsl.rule_id(program) == hashlib.blake2b(text.encode(), digest_size=16).hexdigest()
        assert rules.from_dict(program.to_dict()) == program
        for variant in program.variants():
            a, b = program.to_dict(), variant.to_dict()
            assert sum(a[k] != b[k] for k in a) == 1
        for stage, plain in program.neutralised():
            assert plain != program and plain in program.variants(), stage


@pytest.mark.parametrize("data, named", [
    ({"family": "rays", "directions": "sideways", "stop": "wall", "paint": "mark"}, "directions"),
    ({"family": "count_pack", "feature": "any", "layout": "row", "tile": "mark"}, "connectivity"),
    ({"family": "symmetry_repair", "axis": "lr", "damage": "mark", "output": "repaired", "x": 1}, "x"),
    ({"family": "gravity", "direction": "sideways", "unit": "cell", "movers": "all"}, "direction"),
    ({"family": "connect", "axes": "both", "block": "clear"}, "paint"),
    ({"family": "recolour", "prop": "size", "test": "even", "others": "keep", "connectivity": 4}, "test"),
    ({"family": "spirals"}, "family")])
def test_bad_rule_json_names_the_source_and_the_field(data, named):
    with pytest.raises(dsl.ProgramError, match=rf"^corpus/manifest.jsonl: .*{named}"):
        rules.from_dict(data, "corpus/manifest.jsonl")


KEYED = scenes.with_key(np.array([[0, 0, 0, 0, 0, 0],
                                  [0, 4, 0, 0, 5, 5],
                                  [0, 0, 0, 0, 0, 0],
                                  [4, 0, 6, 0, 0, 0],
                                  [0, 4, 0, 0, 7, 0]]), 0, 3)


def test_count_pack_counts_by_feature_and_connectivity_and_packs():
    # body cells, 4-connected: singles (1,1) (3,0) (3,2) (4,1) (4,4) and the pair (1,4)-(1,5); 8-connected:
    # (3,0) (4,1) (3,2) are one object, so the singles are (1,1) and (4,4)
    assert family_count.run(CountPack("single_cell", "row", "mark", 4), KEYED).tolist() == [[3, 3, 3, 3, 3]]
    assert family_count.run(CountPack("single_cell", "row", "colour", 8), KEYED).tolist() == [[4, 7]]
    assert family_count.run(CountPack("any", "square", "colour", 8), KEYED).tolist() == [[4, 5], [4, 7]]
    # on the border: the pair, (3,0), (4,1), (4,4)
    assert family_count.run(CountPack("on_border", "column", "mark", 4), KEYED).shape == (4, 1)
    with pytest.raises(oracle.EmptyMask):
        family_count.run(CountPack("holed", "row", "mark", 4), KEYED)


def test_symmetry_repair_restores_from_the_mirror_and_raises_instead_of_guessing():
    body = np.array([[1, 2, 2, 1], [3, 9, 4, 3]])  # 9 is the damage (the key's mark)
    grid = scenes.with_key(body, 0, 9)
    assert family_symmetry.run(SymmetryRepair("lr", "mark", "repaired"), grid).tolist() == [[1, 2, 2, 1], [3, 4, 4, 3]]
    assert family_symmetry.run(SymmetryRepair("lr", "mark", "patch"), grid).tolist() == [[4]]
    with pytest.raises(oracle.Asymmetric):  # repaired from its rot180 image (2), the body is not rot180-symmetric
        family_symmetry.run(SymmetryRepair("rot180", "mark", "repaired"), grid)
    both_damaged = scenes.with_key(np.array([[1, 9, 9, 1]]), 0, 9)
    with pytest.raises(oracle.Ambiguous):  # every mirror image of a damaged cell is damaged
        family_symmetry.run(SymmetryRepair("lr", "mark", "repaired"), both_damaged)
    with pytest.raises(oracle.NoObjects):  # no background cell: no damage of that role
        family_symmetry.run(SymmetryRepair("lr", "background", "repaired"), grid)


def test_rays_stop_at_walls_or_pass_behind_them_and_take_the_hit_colour():
    body = np.array([[0, 3, 0, 5, 0], [0, 0, 0, 0, 0]])
    grid = scenes.with_key(body, 0, 3)
    assert family_rays.run(Rays("right", "wall", "mark"), grid).tolist() == [[0, 3, 3, 5, 0], [0, 0, 0, 0, 0]]
    assert family_rays.run(Rays("right", "border", "hit"), grid).tolist() == [[0, 3, 5, 5, 5], [0, 0, 0, 0, 0]]
    assert family_rays.run(Rays("cross", "wall", "hit"), grid).tolist() == [[0, 3, 5, 5, 0], [0, 0, 0, 0, 0]]
    crossing = scenes.with_key(np.array([[0, 3, 0, 0], [3, 0, 0, 6], [0, 7, 0, 0]]), 0, 3)
    with pytest.raises(oracle.Ambiguous):  # (1,1): 7 from the ray going down, 6 from the ray going right
        family_rays.run(Rays("cross", "wall", "hit"), crossing)
    clash = scenes.with_key(np.array([[3, 0, 0, 3], [6, 0, 0, 7]]), 0, 3)  # two rays of one colour agree
    assert family_rays.run(Rays("horizontal", "wall", "mark"), clash).tolist() == [[3, 3, 3, 3], [6, 0, 0, 7]]


def test_gravity_drops_cells_or_objects_and_can_leave_walls_in_place():
    body = np.array([[3, 3, 0],
                     [0, 3, 5],
                     [0, 0, 0],
                     [6, 0, 0]])
    grid = scenes.with_key(body, 0, 3)
    assert family_gravity.run(Gravity("down", "cell", "all"), grid).tolist() == [[0, 0, 0], [0, 0, 0], [3, 3, 0],
                                                                                 [6, 3, 5]]
    # the 3-object falls whole, two rows, until its left arm rests on the 6; the 5 and the 6 stay (walls)
    assert family_gravity.run(Gravity("down", "object", "mark"), grid).tolist() == [[0, 0, 0], [0, 0, 5], [3, 3, 0],
                                                                                    [6, 3, 0]]
    assert family_gravity.run(Gravity("right", "cell", "mark"), grid).tolist() == [[0, 3, 3], [0, 3, 5], [0, 0, 0],
                                                                                   [6, 0, 0]]
    with pytest.raises(oracle.NoObjects):
        family_gravity.run(Gravity("up", "cell", "mark"), scenes.with_key(np.array([[5, 0], [0, 0]]), 0, 3))


def test_connect_joins_facing_points_of_one_colour_around_or_through_walls():
    body = np.array([[4, 0, 0, 0, 4],
                     [0, 0, 0, 0, 0],
                     [4, 0, 0, 0, 0],
                     [0, 0, 0, 0, 0],
                     [6, 0, 7, 0, 6]])
    grid = scenes.with_key(body, 0, 3)
    assert family_connect.run(Connect("horizontal", "clear", "own"), grid).tolist() == [
        [4, 4, 4, 4, 4], [0, 0, 0, 0, 0], [4, 0, 0, 0, 0], [0, 0, 0, 0, 0], [6, 0, 7, 0, 6]]
    assert family_connect.run(Connect("horizontal", "through", "mark"), grid)[4].tolist() == [6, 3, 7, 3, 6]
    assert family_connect.run(Connect("vertical", "clear", "own"), grid)[:, 0].tolist() == [4, 4, 4, 0, 6]
    with pytest.raises(oracle.Ambiguous):  # the 4-line and the 5-line cross at the centre
        family_connect.run(Connect("both", "through", "own"),
                           scenes.with_key(np.array([[0, 0, 4, 0, 0], [0] * 5, [5, 0, 0, 0, 5], [0] * 5,
                                                     [0, 0, 4, 0, 0]]), 0, 3))
    with pytest.raises(oracle.EmptyMask):
        family_connect.run(Connect("diagonal", "clear", "own"), grid)


def test_recolour_paints_every_object_that_passes_ties_included():
    body = np.array([[5, 5, 0, 6],
                     [0, 0, 0, 6],
                     [7, 0, 0, 0],
                     [0, 8, 8, 0]])
    grid = scenes.with_key(body, 0, 3)
    # sizes under 4-connectivity: 2, 2, 1, 2 (the 7 and the 8s touch at a corner: one object of 3 under 8)
    assert family_recolour.run(Recolour("size", "max", "keep", 4), grid).tolist() == [
        [3, 3, 0, 3], [0, 0, 0, 3], [7, 0, 0, 0], [0, 3, 3, 0]]
    assert family_recolour.run(Recolour("size", "unique", "erase", 8), grid).tolist() == [
        [0, 0, 0, 0], [0, 0, 0, 0], [3, 0, 0, 0], [0, 3, 3, 0]]
    assert family_recolour.run(Recolour("height", "odd", "keep", 4), grid)[0].tolist() == [3, 3, 0, 6]
    with pytest.raises(oracle.EmptyMask):
        family_recolour.run(Recolour("width", "unique", "keep", 4),
                            scenes.with_key(np.array([[5, 0, 6]]), 0, 3))


@pytest.mark.parametrize("program", SAMPLES, ids=lambda p: p.family)
def test_scenes_carry_a_palette_key_a_fresh_palette_and_stay_in_bounds(program):
    rng = np.random.default_rng(5)
    keys = set()
    for _ in range(10):
        x, y = rules.propose(program, rng)
        bg, mark, _ = oracle.parse_key(x)
        keys.add((bg, mark))
        assert np.array_equal(rules.run(program, x), y)
        for g in (x, y):
            assert 1 <= min(g.shape) and max(g.shape) <= 30 and 0 <= g.min() and g.max() <= 9
    assert len(keys) >= 6


def test_every_family_has_typed_inputs_in_the_probe_bank(probes):
    assert len(probes) == (len(scenes.probe_bank()) + sum(rules.TYPED_PROBES.values())
                           + len(rules.FAMILIES) ** 2 * rules.PANEL_PROBES)
    assert all(np.array_equal(a, b) for a, b in zip(probes, rules.probe_bank()))
    for program in SAMPLES:  # a rule is valid on enough probes to be admitted
        assert int((admission.raw_behaviour(program, probes) >= 0).sum()) >= admission.MIN_VALID, program.family


@pytest.mark.parametrize("program", SAMPLES, ids=lambda p: p.family)
def test_a_task_of_each_family_passes_the_gate(program, probes):
    pairs = gate.make_task(program, np.random.default_rng(1), probes)
    assert gate.judge_task(program, pairs, probes).accepted
    for variant in gate.distinct_variants(program, probes):
        assert gate._wrong_on(variant, pairs) >= gate.MIN_WRONG
