"""training/corpus: test pairs as informative as the demonstrations, stages the demonstrations show, difficulty."""

from __future__ import annotations

import doctest

import numpy as np
import pytest

from training.corpus import difficulty, gate, oracle, rules, scenes, shortcuts
from training.corpus.dsl import MaskOp, SelectMaskRender, Selector
from training.corpus.family_rays import Rays
from training.corpus.family_recolour import Recolour

# On the code before issue 32 both gave an accepted task whose test output was its input unchanged (seeds 0 and 1),
# and HORIZONTAL one whose test pair showed 3 cells against at least 4 in every demonstration.
DOWN_HIT = Rays("down", "wall", "hit")
HORIZONTAL = Rays("horizontal", "border", "mark")


@pytest.fixture(scope="module")
def probes():
    return rules.probe_bank()


def test_docstring_examples_hold():
    assert doctest.testmod(difficulty).failed == 0


@pytest.mark.parametrize("program", [DOWN_HIT, HORIZONTAL])
@pytest.mark.parametrize("seed", [0, 1])
def test_the_test_pair_is_as_informative_as_the_demonstrations(program, seed, probes):
    pairs = gate.make_task(program, np.random.default_rng(seed), probes)
    x, y = pairs[-1]
    assert not difficulty.is_no_op(x, y)
    assert difficulty.information(x, y) >= min(difficulty.information(a, b) for a, b in pairs[:-1])
    assert difficulty.weak_test_pair(pairs) == ""
    assert gate.judge_task(program, pairs, probes).accepted


def _no_op_pair(program, rng):
    while True:
        x, y = rules.propose(program, rng)
        if difficulty.is_no_op(x, y):
            return x, y


def test_the_gate_rejects_a_no_op_test_pair(probes):
    pairs = gate.make_task(DOWN_HIT, np.random.default_rng(0), probes)
    assert gate.judge_task(DOWN_HIT, pairs, probes).accepted
    noop = pairs[:-1] + [_no_op_pair(DOWN_HIT, np.random.default_rng(5))]
    report = gate.judge_task(DOWN_HIT, noop, probes)
    assert (report.reason, report.detail) == ("weak_test", "the test output is its input unchanged")


def test_the_gate_rejects_a_1x1_test_output_when_no_demonstration_has_one():
    x = np.array([[0, 3, 0], [0, 5, 5], [0, 0, 5]])
    demos = [(x, np.array([[5, 5]]))] * 5
    assert difficulty.weak_test_pair(demos + [(x, np.array([[5]]))]) == \
        "the test output is 1x1 and no demonstration's is"
    assert difficulty.weak_test_pair([(x, np.array([[5]]))] * 6) == ""


def test_the_identity_shortcut_sees_bodies_below_the_key_row():
    rng = np.random.default_rng(3)
    pairs = [(x, x[1:]) for x in (rules.random_scene(DOWN_HIT, rng) for _ in range(6))]
    assert shortcuts.solved_by(pairs[:-1], pairs[-1]) == ["identity"]


def _shows(stage_free, pair) -> bool:
    try:
        return not np.array_equal(rules.run(stage_free, pair[0]), pair[1])
    except oracle.OracleError:
        return True


def test_a_stage_that_only_one_demonstration_and_the_test_pair_show_is_invisible(probes):
    # the connectivity changes two of the six outputs, which the old stage check counted as enough; but only one of
    # them is a demonstration
    program = SelectMaskRender(Selector("size", "max"), MaskOp("keep", 0), (), "crop_source", 4)
    twin = dict(program.neutralised())["connectivity"]
    rng = np.random.default_rng(1)
    proposed = [rules.propose(program, rng) for _ in range(300)]
    shown = [p for p in proposed if _shows(twin, p)]
    hidden = [p for p in proposed if not _shows(twin, p)]
    pairs = hidden[:4] + shown[:2]
    assert gate._wrong_on(twin, pairs) == gate.MIN_WRONG
    assert difficulty.invisible_stage(program, pairs[:-1]) == \
        "connectivity changes 1 demonstration outputs, fewer than 2"
    assert gate.judge_task(program, pairs, probes).reason == "invisible"
    assert gate.judge_task(program, hidden[:3] + shown[:3], probes).reason != "invisible"


def test_a_stage_whose_whole_effect_is_one_cell_per_demonstration_is_invisible():
    # erasing the other objects instead of keeping them changes one cell (the lone single cell) of each output
    program = Recolour("size", "max", "erase", 4)
    demos = []
    for shift in range(5):
        body = np.zeros((6, 6 + shift), dtype=np.int8)
        body[0:2, 0:2] = 5
        body[4, 3 + shift] = 6
        x = scenes.with_key(body, 0, 3)
        demos.append((x, rules.run(program, x)))
    assert difficulty.invisible_stage(program, demos) == \
        "others changes at most 1 cell of a demonstration, fewer than 2"
    bigger = list(demos)
    x = demos[0][0].copy()
    x[2, 4:6] = 7  # another object, of two cells: erasing now changes three cells of this demonstration
    bigger[0] = (x, rules.run(program, x))
    assert difficulty.invisible_stage(program, bigger).startswith("connectivity")
