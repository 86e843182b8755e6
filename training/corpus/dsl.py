"""Rules as typed programs (SPEC 11): frozen dataclasses, stored as canonical JSON, named by BLAKE2b-128 of it.

This module holds the select-mask-render family and what every family shares (canonical JSON, ids, ProgramError).
Every program, of any family (`family_*.py`) or composite (`compose.py`), has the same small interface:
`family`, `produces` ("scene": a picture the size of the body, which can be keyed again; "crop": anything else),
`to_dict()`, `variants()` (one-node variants), `neutralised()` (stage -> the program with it neutral) and
`dropped()` (component -> the program without it; empty for a single rule). `rules.py` reads and runs any of them.
A select-mask-render program reads an input whose palette key names the background and the mark colour, picks ONE
connected component of the body by a metric and min/max, turns its cells into a mask with an operator and an
amount, applies optional post operations to the mask, and renders the mask. Every stage is a typed value from a
closed vocabulary, so a program is validated when it is read, and one-node variants (for the task gate) are
enumerable.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

METRICS = ("size", "height", "width", "bbox_area", "n_colours", "top", "left")
EXTREMES = ("min", "max")
# operator -> allowed amounts
MASK_OPS = {"keep": (0,), "dilate": (1, 2), "erode": (1,), "outline": (1, 2), "bbox": (0, 1)}
POST_OPS = ("fill_holes", "bbox_invert", "flip_lr", "flip_ud")
RENDERERS = ("paint", "erase", "crop_mask", "crop_source")
CONNECTIVITIES = (4, 8)
FAMILIES = ("select_mask_render",)


class ProgramError(ValueError):
    """A rule's JSON names an unknown family, stage or value; the message names the field."""


@dataclass(frozen=True)
class Selector:
    """Pick the one component whose `metric` is the `extreme` over all components (a tie is ambiguous)."""
    metric: str
    extreme: str


@dataclass(frozen=True)
class MaskOp:
    """Turn the selected component's cells into a mask; `amount` is the radius or thickness (0 where unused)."""
    op: str
    amount: int


@dataclass(frozen=True)
class SelectMaskRender:
    selector: Selector
    mask: MaskOp
    post: tuple[str, ...]
    renderer: str
    connectivity: int
    family: str = "select_mask_render"

    @property
    def produces(self) -> str:
        return "scene" if self.renderer in ("paint", "erase") else "crop"

    def to_dict(self) -> dict:
        return {"family": self.family, "connectivity": self.connectivity,
                "selector": {"metric": self.selector.metric, "extreme": self.selector.extreme},
                "mask": {"op": self.mask.op, "amount": self.mask.amount},
                "post": list(self.post), "renderer": self.renderer}

    def variants(self) -> list:
        return one_node_variants(self)

    def neutralised(self) -> list:
        return neutralised(self)

    def dropped(self) -> list:
        return []

    def __post_init__(self) -> None:
        _check("selector.metric", self.selector.metric, METRICS)
        _check("selector.extreme", self.selector.extreme, EXTREMES)
        _check("mask.op", self.mask.op, tuple(MASK_OPS))
        _check("mask.amount", self.mask.amount, MASK_OPS[self.mask.op])
        for i, name in enumerate(self.post):
            _check(f"post[{i}]", name, POST_OPS)
        if len(self.post) > 2 or len(set(self.post)) < len(self.post):
            raise ProgramError(f"post: at most 2 different post operations, got {list(self.post)}")
        _check("renderer", self.renderer, RENDERERS)
        _check("connectivity", self.connectivity, CONNECTIVITIES)
        _check("family", self.family, FAMILIES)


Program = SelectMaskRender


def _check(field: str, value, allowed: tuple) -> None:
    if value not in allowed:
        raise ProgramError(f"{field}: {value!r} is not one of {list(allowed)}")


def to_dict(program) -> dict:
    """Any family's program as plain JSON data."""
    return program.to_dict()


def canonical_json(program) -> str:
    """Sorted keys, no spaces, ASCII: the same program always gives the same bytes (and so the same id)."""
    return json.dumps(to_dict(program), sort_keys=True, separators=(",", ":"), ensure_ascii=True)


def rule_id(program) -> str:
    """BLAKE2b-128 of the canonical JSON, as 32 hex digits."""
    return hashlib.blake2b(canonical_json(program).encode("ascii"), digest_size=16).hexdigest()


def from_dict(data: dict, source: str = "rule") -> Program:
    """Read a rule; any missing or unknown field raises ProgramError naming `source` and the field."""
    try:
        if not isinstance(data, dict):
            raise ProgramError(f"expected an object, got {type(data).__name__}")
        expected = {"family", "connectivity", "selector", "mask", "post", "renderer"}
        if set(data) != expected:
            raise ProgramError(f"fields {sorted(set(data) ^ expected)} missing or unknown")
        if data["family"] not in FAMILIES:
            raise ProgramError(f"family: {data['family']!r} is not one of {list(FAMILIES)}")
        sel, mask = data["selector"], data["mask"]
        if not isinstance(sel, dict) or set(sel) != {"metric", "extreme"}:
            raise ProgramError("selector: expected {metric, extreme}")
        if not isinstance(mask, dict) or set(mask) != {"op", "amount"}:
            raise ProgramError("mask: expected {op, amount}")
        if not isinstance(data["post"], list):
            raise ProgramError("post: expected a list")
        if mask["op"] not in MASK_OPS:
            raise ProgramError(f"mask.op: {mask['op']!r} is not one of {list(MASK_OPS)}")
        return SelectMaskRender(Selector(sel["metric"], sel["extreme"]), MaskOp(mask["op"], mask["amount"]),
                                tuple(data["post"]), data["renderer"], data["connectivity"])
    except ProgramError as err:
        raise ProgramError(f"{source}: {err}") from None


def from_json(text: str, source: str = "rule") -> Program:
    return from_dict(json.loads(text), source)


def all_programs() -> list[Program]:
    """Every program of the family (post operations: none, one, or an ordered pair of two different ones)."""
    posts = [()] + [(p,) for p in POST_OPS] + [(a, b) for a in POST_OPS for b in POST_OPS if a != b]
    return [SelectMaskRender(Selector(m, e), MaskOp(op, k), post, r, c)
            for m in METRICS for e in EXTREMES for op, amounts in MASK_OPS.items() for k in amounts
            for post in posts for r in RENDERERS for c in CONNECTIVITIES]


def one_node_variants(program: Program) -> list[Program]:
    """Every valid program that differs from `program` in exactly one syntax node (for the task gate)."""
    out = []
    for m in METRICS:
        if m != program.selector.metric:
            out.append(_replace(program, selector=Selector(m, program.selector.extreme)))
    out.append(_replace(program, selector=Selector(program.selector.metric,
                                                   "min" if program.selector.extreme == "max" else "max")))
    for op, amounts in MASK_OPS.items():
        for k in amounts:
            if (op, k) != (program.mask.op, program.mask.amount):
                out.append(_replace(program, mask=MaskOp(op, k)))
    for i in range(len(program.post)):
        out.append(_replace(program, post=program.post[:i] + program.post[i + 1:]))
        for p in POST_OPS:
            if p != program.post[i]:
                post = program.post[:i] + (p,) + program.post[i + 1:]
                if len(set(post)) == len(post):
                    out.append(_replace(program, post=post))
    if len(program.post) < 2:
        out.extend(_replace(program, post=program.post + (p,)) for p in POST_OPS if p not in program.post)
    out.extend(_replace(program, renderer=r) for r in RENDERERS if r != program.renderer)
    out.append(_replace(program, connectivity=12 - program.connectivity))
    return out


def _replace(program: Program, **changes) -> Program:
    fields = {"selector": program.selector, "mask": program.mask, "post": program.post,
              "renderer": program.renderer, "connectivity": program.connectivity}
    fields.update(changes)
    return SelectMaskRender(**fields)


def neutralised(program: Program) -> list[tuple[str, Program]]:
    """(stage name, the program with that stage made neutral) for every stage that has a neutral form.

    >>> p = SelectMaskRender(Selector("size", "max"), MaskOp("dilate", 1), ("flip_lr",), "paint", 4)
    >>> [name for name, _ in neutralised(p)]
    ['mask', 'post[0]', 'connectivity']
    """
    out = []
    if program.mask.op != "keep":
        out.append(("mask", _replace(program, mask=MaskOp("keep", 0))))
    for i in range(len(program.post)):
        out.append((f"post[{i}]", _replace(program, post=program.post[:i] + program.post[i + 1:])))
    out.append(("connectivity", _replace(program, connectivity=12 - program.connectivity)))
    return out


def check_fields(data, expected: set[str]) -> dict:
    """`data` must be an object with exactly the `expected` keys (the error names the odd ones).

    >>> check_fields({"a": 1}, {"a", "b"})  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    training.corpus.dsl.ProgramError: fields ['b'] missing or unknown
    """
    if not isinstance(data, dict):
        raise ProgramError(f"expected an object, got {type(data).__name__}")
    if set(data) != expected:
        raise ProgramError(f"fields {sorted(set(data) ^ expected)} missing or unknown")
    return data


def check(field: str, value, allowed: tuple) -> None:
    """Raise ProgramError naming `field` unless `value` is one of `allowed`."""
    _check(field, value, allowed)
