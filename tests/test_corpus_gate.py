"""training/corpus: the task gate accepts a separating task and rejects one that leaves two rules tied."""

from __future__ import annotations

import numpy as np
import pytest

from training.corpus import dsl, gate, oracle, scenes
from training.corpus.dsl import MaskOp, SelectMaskRender, Selector

PROGRAM = SelectMaskRender(Selector("size", "max"), MaskOp("dilate", 1), (), "crop_mask", 8)
BY_AREA = SelectMaskRender(Selector("bbox_area", "max"), MaskOp("dilate", 1), (), "crop_mask", 8)


@pytest.fixture(scope="module")
def probes():
    return scenes.probe_bank()


@pytest.fixture(scope="module")
def made(probes):
    return gate.make_task(PROGRAM, np.random.default_rng(0), probes)


def test_a_task_chosen_from_scenes_passes_the_gate(made, probes):
    assert gate.judge_task(PROGRAM, made, probes).reason == "accepted"
    assert gate._wrong_on(BY_AREA, made) >= gate.MIN_WRONG  # the chosen scenes separate size from box area


def _solid_scene(rng: np.random.Generator, shift: int) -> np.ndarray:
    """Two diagonal 2x2 boxes (one object under 8-connectivity, 8 cells, box area 16) and a 3x2 box (6 cells):
    largest by cells and largest by box area are always the same object, so no such pair separates them."""
    bg, mark, a, b = (int(c) for c in rng.choice(10, 4, replace=False))
    body = np.full((9, 9 + shift), bg, dtype=np.int8)
    top = shift % 2  # moving the pair off the edge changes the output's shape (its dilation is clipped less)
    body[top:top + 2, 0:2] = a
    body[top + 2:top + 4, 2:4] = a
    body[6:9, 5 + shift:7 + shift] = b
    return scenes.with_key(body, bg, mark)


def test_demonstrations_that_do_not_separate_two_rules_are_rejected(probes):
    rng = np.random.default_rng(4)
    pairs = [(x, oracle.run(PROGRAM, x)) for x in (_solid_scene(rng, s) for s in range(6))]
    assert gate._wrong_on(BY_AREA, pairs) == 0
    report = gate.judge_task(PROGRAM, pairs, probes)
    assert report.reason == "not_separated" and '"op":"dilate"' in report.detail


def test_gate_rejections_name_their_reason(made, probes):
    assert gate.judge_task(PROGRAM, made[:5], probes).reason == "shape"
    twice = made[:5] + [made[0]]
    assert gate.judge_task(PROGRAM, twice, probes).reason == "shape"
    x, y = made[2]
    broken = y.copy()
    broken[0, 0] = (broken[0, 0] + 1) % 10
    assert gate.judge_task(PROGRAM, made[:2] + [(x, broken)] + made[3:], probes).reason == "replay"
    # a rival that the demonstrations cannot tell apart (here: the program itself, as a nearest admitted rule)
    assert gate.judge_task(PROGRAM, made, probes, rivals=[PROGRAM]).reason == "not_separated"


def test_a_stage_that_changes_too_few_outputs_is_rejected(probes):
    # the boxes are solid and >= 2 apart, so connectivity 4 or 8 finds the same objects: the stage is not identified
    rng = np.random.default_rng(2)
    program = SelectMaskRender(Selector("size", "max"), MaskOp("keep", 0), (), "crop_source", 8)
    inputs = []
    for shift in range(6):
        bg, mark, a, b = (int(c) for c in rng.choice(10, 4, replace=False))
        body = np.full((8, 8 + shift), bg, dtype=np.int8)
        body[0:2, 0:3 + shift % 3] = a
        body[5:7, 4:6] = b
        inputs.append(scenes.with_key(body, bg, mark))
    report = gate.judge_task(program, [(x, oracle.run(program, x)) for x in inputs], probes)
    assert (report.reason, report.detail) == ("stage", "connectivity changes fewer than 2 outputs")


def test_stages_with_a_neutral_form_are_listed():
    program = SelectMaskRender(Selector("top", "min"), MaskOp("outline", 2), ("flip_ud", "fill_holes"), "erase", 4)
    names = [name for name, _ in dsl.neutralised(program)]
    assert names == ["mask", "post[0]", "post[1]", "connectivity"]
    assert dict(dsl.neutralised(program))["post[0]"].post == ("fill_holes",)
