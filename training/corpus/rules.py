"""Any rule, of any family or composite: read it from JSON, run it, propose inputs for it, list a family's rules.

The families (single rules) are select_mask_render (dsl.py, oracle.py, scenes.py), count_pack, symmetry_repair,
rays, gravity, connect and recolour (family_*.py); compositions are sequential, select and parallel (compose.py).
`probe_bank()` is admission's fixed bank: the shared bank of scenes.py (select-mask-render scenes and keyed noise),
TYPED_PROBES[family] inputs of each other family's scene generator, then PANEL_PROBES panel inputs (panels.py) for
each ordered pair of families, so every rule is measured on the same slots and on inputs of its own kind.
"""

from __future__ import annotations

import numpy as np

from training.corpus import (compose, dsl, family_connect, family_count, family_gravity, family_rays, family_recolour,
                             family_symmetry, oracle, panels, scenes)
from training.corpus.dsl import ProgramError

LEAVES = {"select_mask_render": (dsl.SelectMaskRender, dsl.from_dict, oracle.run, scenes.random_scene,
                                 dsl.all_programs),
          family_count.FAMILY: (family_count.CountPack, family_count.from_dict, family_count.run,
                                family_count.random_scene, family_count.all_programs),
          family_symmetry.FAMILY: (family_symmetry.SymmetryRepair, family_symmetry.from_dict, family_symmetry.run,
                                   family_symmetry.random_scene, family_symmetry.all_programs),
          family_rays.FAMILY: (family_rays.Rays, family_rays.from_dict, family_rays.run, family_rays.random_scene,
                               family_rays.all_programs),
          family_gravity.FAMILY: (family_gravity.Gravity, family_gravity.from_dict, family_gravity.run,
                                  family_gravity.random_scene, family_gravity.all_programs),
          family_connect.FAMILY: (family_connect.Connect, family_connect.from_dict, family_connect.run,
                                  family_connect.random_scene, family_connect.all_programs),
          family_recolour.FAMILY: (family_recolour.Recolour, family_recolour.from_dict, family_recolour.run,
                                   family_recolour.random_scene, family_recolour.all_programs)}
FAMILIES = tuple(LEAVES)
# inputs per family in the bank: a symmetry-repair rule runs on about a quarter of its family's scenes (the template
# must have its axis and the damage its role), so that family needs 64 to reach admission's 16 valid probes; a
# connect rule runs only where two points face each other along its axes (a diagonal rule on about half its scenes)
TYPED_PROBES = {family_count.FAMILY: 16, family_symmetry.FAMILY: 64, family_rays.FAMILY: 16, family_gravity.FAMILY: 16,
                family_connect.FAMILY: 32, family_recolour.FAMILY: 16}
# panel inputs per ordered pair of families (half side by side, half stacked). 32 per pair was enough for the four
# first families (a PARALLEL of two rays rules valid on about 40 slots); at seven families (49 pairs) 32 would triple
# admission's panel work (tests/test_corpus_compose.py's resume test: 18 s -> 60 s at load 7-13), and at 20 a
# PARALLEL of two rays rules is valid on 57-64 slots, of two count rules on 20-74, of connect and rays on 24-25, all
# above admission's 16; 49 x 20 = 980 slots
PANEL_PROBES = 20


def from_dict(data, source: str = "rule"):
    """Read any rule; a bad field raises ProgramError naming `source` and the field's path."""
    try:
        return _read(data)
    except ProgramError as err:
        raise ProgramError(f"{source}: {err}") from None


def _read(data):
    if not isinstance(data, dict) or "family" not in data:
        raise ProgramError("expected an object with a family")
    family = data["family"]
    if family in LEAVES:
        return LEAVES[family][1](data)
    if family == "sequential":
        dsl.check_fields(data, {"family", "first", "then"})
        return compose.Sequential(_nested(data, "first"), _nested(data, "then"))
    if family == "select":
        dsl.check_fields(data, {"family", "predicate", "if_true", "if_false"})
        return compose.Select(data["predicate"], _nested(data, "if_true"), _nested(data, "if_false"))
    if family == "parallel":
        dsl.check_fields(data, {"family", "join", "first", "second"})
        return compose.Parallel(_nested(data, "first"), _nested(data, "second"), data["join"])
    raise ProgramError(f"family: {family!r} is not one of {list(FAMILIES) + list(compose.COMPOSITIONS)}")


def _nested(data: dict, field: str):
    try:
        return _read(data[field])
    except ProgramError as err:
        raise ProgramError(f"{field}.{err}" if str(err).split(":")[0].isidentifier() else f"{field}: {err}") from None


def predicate(name: str, grid: np.ndarray) -> bool:
    """A typed predicate of a keyed input (SELECT): the body is wider than tall; the mark colour occurs in the body;
    the body has more than 3 objects (8-connected).

    >>> g = scenes.with_key(np.array([[5, 0, 3], [0, 0, 0]]), 0, 3)
    >>> [predicate(n, g) for n in compose.PREDICATES]
    [True, True, False]
    """
    bg, mark, body = oracle.parse_key(np.asarray(grid, dtype=np.int8))
    if name == "wider_than_tall":
        return body.shape[1] > body.shape[0]
    if name == "mark_in_body":
        return bool((body == mark).any())
    if name == "many_objects":
        return len(oracle.labelled(body, bg, 8)) > 3
    raise ValueError(f"unknown predicate {name!r}")


def run(program, grid: np.ndarray) -> np.ndarray:
    """The program's output on one keyed input, or an oracle.OracleError."""
    if isinstance(program, compose.Sequential):
        bg, mark, _ = oracle.parse_key(np.asarray(grid, dtype=np.int8))
        middle = run(program.first, grid)
        if middle.shape[1] < 2:
            raise oracle.BadKey("the first rule's output is too narrow to carry the palette key")
        return run(program.then, scenes.with_key(middle, bg, mark))
    if isinstance(program, compose.Select):
        return run(program.if_true if predicate(program.predicate, grid) else program.if_false, grid)
    if isinstance(program, compose.Parallel):
        bg, mark, div, _, first, second = panels.split(grid)
        return panels.join(run(program.first, scenes.with_key(first, bg, mark)),
                           run(program.second, scenes.with_key(second, bg, mark)), div, program.join)
    if program == compose.IDENTITY:
        return oracle.parse_key(np.asarray(grid, dtype=np.int8))[2]
    return LEAVES[program.family][2](program, grid)


def random_scene(program, rng: np.random.Generator) -> np.ndarray:
    """An input of the program's kind: its family's scene; a SEQUENTIAL's first rule's; a SELECT's either branch's;
    a PARALLEL's, two panels of its components' kinds, split along its join 4 times in 5 (the outputs of two scene
    rules fit together only that way, unless the panels have one shape)."""
    if isinstance(program, compose.Parallel):
        axis = program.join if rng.random() < 0.8 else panels.AXES[1 - panels.AXES.index(program.join)]
        while True:
            made = panels.panel_scene(random_scene(program.first, rng), random_scene(program.second, rng), axis, rng)
            if made is not None:
                return made
    if isinstance(program, compose.Sequential):
        return random_scene(program.first, rng)
    if isinstance(program, compose.Select):
        return random_scene(program.if_true if rng.random() < 0.5 else program.if_false, rng)
    return LEAVES[program.family][3](rng)


def propose(program, rng: np.random.Generator, tries: int = 200) -> tuple[np.ndarray, np.ndarray]:
    """An (input, output) pair on which the oracle gives one answer; ValueError when `tries` scenes all fail."""
    for _ in range(tries):
        grid = random_scene(program, rng)
        try:
            return grid, run(program, grid)
        except oracle.OracleError:
            continue
    raise ValueError(f"no unambiguous scene in {tries} tries for {dsl.canonical_json(program)}")


def probe_bank() -> tuple[np.ndarray, ...]:
    """The fixed bank: the shared bank, TYPED_PROBES[family] scenes of each other family, then PANEL_PROBES panel
    inputs per ordered pair of families (constant seeds; single rules refuse the panels, see panels.py)."""
    probes = list(scenes.probe_bank())
    for i, family in enumerate(FAMILIES[1:], start=1):
        rng = np.random.default_rng([scenes.PROBE_SEED, i])
        probes.extend(LEAVES[family][3](rng) for _ in range(TYPED_PROBES[family]))
    rng = np.random.default_rng([scenes.PROBE_SEED, len(FAMILIES)])
    for first in FAMILIES:
        for second in FAMILIES:
            for i in range(PANEL_PROBES):
                made = None
                while made is None:
                    made = panels.panel_scene(LEAVES[first][3](rng), LEAVES[second][3](rng), panels.AXES[i % 2], rng)
                probes.append(made)
    return tuple(probes)


def all_programs(family: str) -> list:
    """Every single rule of one family."""
    return LEAVES[family][4]()
