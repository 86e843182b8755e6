"""Composite rules (issue #19, beyond the study): rules combined into multi-step rules, typed by what they produce.

SEQUENTIAL runs `then` on the output of `first`, keyed again with the input's palette key; it is well typed only
when `first` produces a scene (a picture of the body's size, which `then`'s scene-reading families accept).
SELECT runs `if_true` or `if_false`, chosen per input by a typed predicate of the keyed input (PREDICATES).
PARALLEL runs `first` on the first panel of a panel input (panels.py: two panels behind a divider line whose colour
the key names) and `second` on the second, and joins their outputs side by side or stacked (`join`), a divider line
between them. What a rule reads is typed too: a PARALLEL reads panels, every other rule reads one keyed scene, so a
PARALLEL cannot be a component of any composite (its components, SELECT's branches and SEQUENTIAL's `then` are each
given one keyed scene).
A composite is a rule like any other: it has an id, a canonical JSON, one-node variants (one node changed inside one
component, or the predicate), neutralised stages (its components', lifted) and, unlike a single rule, `dropped()`:
the composite without one component, which the gate's materiality check compares against (a PARALLEL's component is
replaced by IDENTITY, which leaves its panel as it is).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from training.corpus.dsl import ProgramError, check

PREDICATES = ("wider_than_tall", "mark_in_body", "many_objects")
JOINS = ("side", "stack")
COMPOSITIONS = ("sequential", "select", "parallel")


def depth(program) -> int:
    """How many single rules a program is made of (1 for a single rule)."""
    return getattr(program, "depth", 1)


def reads(program) -> str:
    """"panels" for a PARALLEL, "scene" (one keyed scene) for every other rule."""
    return getattr(program, "reads", "scene")


def components(program) -> list:
    """The rules a composite is made of, at every level (none for a single rule): its fields that are rules. Pure."""
    parts = [value for value in (getattr(program, f.name) for f in fields(program)) if hasattr(value, "family")]
    return [rule for part in parts for rule in (part, *components(part))]


def kin(programs: list) -> list[list[int]]:
    """Per program, the positions of the others it is made of or that are made of it: rivals whatever their distance
    on the probe bank (a SELECT can sit far from its branch on the bank and agree with it on every pair of a task
    whose inputs all take that branch). Pure."""
    position = {program: i for i, program in enumerate(programs)}
    out: list[set[int]] = [set() for _ in programs]
    for i, program in enumerate(programs):
        for part in components(program):
            j = position.get(part)
            if j is not None and j != i:
                out[i].add(j)
                out[j].add(i)
    return [sorted(found) for found in out]


def _reads_scene(field: str, program) -> None:
    if reads(program) != "scene":
        raise ProgramError(f"{field}: a {program.family} rule reads panels, but is given one keyed scene here")


def _valid(make, *args) -> list:
    """`make(*args)`, or nothing when that composite is ill typed (a one-node change can change a component's type)."""
    try:
        return [make(*args)]
    except ProgramError:
        return []


@dataclass(frozen=True)
class Sequential:
    first: object
    then: object
    family: str = "sequential"

    def __post_init__(self) -> None:
        if self.first.produces != "scene":
            raise ProgramError(f"first: a {self.first.family} rule that produces a {self.first.produces} cannot "
                               f"feed another rule")
        _reads_scene("then", self.then)

    @property
    def produces(self) -> str:
        return self.then.produces

    @property
    def depth(self) -> int:
        return depth(self.first) + depth(self.then)

    def to_dict(self) -> dict:
        return {"family": self.family, "first": self.first.to_dict(), "then": self.then.to_dict()}

    def variants(self) -> list:
        return ([v for f in self.first.variants() for v in _valid(Sequential, f, self.then)]
                + [v for t in self.then.variants() for v in _valid(Sequential, self.first, t)])

    def neutralised(self) -> list:
        return ([(f"first.{s}", v) for s, p in self.first.neutralised() for v in _valid(Sequential, p, self.then)]
                + [(f"then.{s}", Sequential(self.first, p)) for s, p in self.then.neutralised()])

    def dropped(self) -> list:
        """Without `first` (then alone on the input), without `then` (first alone), and the components' own."""
        return ([("first", self.then), ("then", self.first)]
                + [(f"first.{s}", v) for s, p in self.first.dropped() for v in _valid(Sequential, p, self.then)]
                + [(f"then.{s}", Sequential(self.first, p)) for s, p in self.then.dropped()])


@dataclass(frozen=True)
class Select:
    predicate: str
    if_true: object
    if_false: object
    family: str = "select"

    def __post_init__(self) -> None:
        check("predicate", self.predicate, PREDICATES)
        _reads_scene("if_true", self.if_true)
        _reads_scene("if_false", self.if_false)
        if self.if_true == self.if_false:
            raise ProgramError("if_true and if_false: the same rule on both branches selects nothing")

    @property
    def produces(self) -> str:
        return "scene" if self.if_true.produces == self.if_false.produces == "scene" else "crop"

    @property
    def depth(self) -> int:
        return depth(self.if_true) + depth(self.if_false)

    def to_dict(self) -> dict:
        return {"family": self.family, "predicate": self.predicate, "if_true": self.if_true.to_dict(),
                "if_false": self.if_false.to_dict()}

    def variants(self) -> list:
        return ([Select(p, self.if_true, self.if_false) for p in PREDICATES if p != self.predicate]
                + [v for t in self.if_true.variants() for v in _valid(Select, self.predicate, t, self.if_false)]
                + [v for f in self.if_false.variants() for v in _valid(Select, self.predicate, self.if_true, f)])

    def neutralised(self) -> list:
        return ([(f"if_true.{s}", v) for s, p in self.if_true.neutralised()
                 for v in _valid(Select, self.predicate, p, self.if_false)]
                + [(f"if_false.{s}", v) for s, p in self.if_false.neutralised()
                   for v in _valid(Select, self.predicate, self.if_true, p)])

    def dropped(self) -> list:
        """Without one branch: the other branch on every input (and the branches' own components dropped)."""
        return ([("if_true", self.if_false), ("if_false", self.if_true)]
                + [(f"if_true.{s}", v) for s, p in self.if_true.dropped()
                   for v in _valid(Select, self.predicate, p, self.if_false)]
                + [(f"if_false.{s}", v) for s, p in self.if_false.dropped()
                   for v in _valid(Select, self.predicate, self.if_true, p)])


@dataclass(frozen=True)
class Identity:
    """The body as it is: what replaces a PARALLEL's component in `dropped()` (never read from JSON, never admitted)."""
    family: str = "identity"
    produces = "scene"

    def to_dict(self) -> dict:
        return {"family": self.family}

    def variants(self) -> list:
        return []

    def neutralised(self) -> list:
        return []

    def dropped(self) -> list:
        return []


IDENTITY = Identity()


@dataclass(frozen=True)
class Parallel:
    first: object
    second: object
    join: str
    family: str = "parallel"
    produces = "crop"  # a divider line runs through it: not a keyed scene another rule could read
    reads = "panels"

    def __post_init__(self) -> None:
        check("join", self.join, JOINS)
        _reads_scene("first", self.first)
        _reads_scene("second", self.second)

    @property
    def depth(self) -> int:
        return depth(self.first) + depth(self.second)

    def to_dict(self) -> dict:
        return {"family": self.family, "join": self.join, "first": self.first.to_dict(),
                "second": self.second.to_dict()}

    def variants(self) -> list:
        return ([Parallel(self.first, self.second, j) for j in JOINS if j != self.join]
                + [Parallel(f, self.second, self.join) for f in self.first.variants()]
                + [Parallel(self.first, s, self.join) for s in self.second.variants()])

    def neutralised(self) -> list:
        return ([(f"first.{s}", Parallel(p, self.second, self.join)) for s, p in self.first.neutralised()]
                + [(f"second.{s}", Parallel(self.first, p, self.join)) for s, p in self.second.neutralised()])

    def dropped(self) -> list:
        """Each component replaced by IDENTITY (its panel passes through as it is), and the components' own."""
        return ([("first", Parallel(IDENTITY, self.second, self.join)),
                 ("second", Parallel(self.first, IDENTITY, self.join))]
                + [(f"first.{s}", Parallel(p, self.second, self.join)) for s, p in self.first.dropped()]
                + [(f"second.{s}", Parallel(self.first, p, self.join)) for s, p in self.second.dropped()])
