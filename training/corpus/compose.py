"""Composite rules (issue #19, beyond the study): rules combined into multi-step rules, typed by what they produce.

SEQUENTIAL runs `then` on the output of `first`, keyed again with the input's palette key; it is well typed only
when `first` produces a scene (a picture of the body's size, which `then`'s scene-reading families accept).
SELECT runs `if_true` or `if_false`, chosen per input by a typed predicate of the keyed input (PREDICATES).
PARALLEL (two rules on two panels of one input) is not built yet: its inputs are absent from the probe bank, so no
parallel rule could show 16 valid probes (training/corpus/README.md).
A composite is a rule like any other: it has an id, a canonical JSON, one-node variants (one node changed inside one
component, or the predicate), neutralised stages (its components', lifted) and, unlike a single rule, `dropped()`:
the composite without one component, which the gate's materiality check compares against.
"""

from __future__ import annotations

from dataclasses import dataclass

from training.corpus.dsl import ProgramError, check

PREDICATES = ("wider_than_tall", "mark_in_body", "many_objects")
COMPOSITIONS = ("sequential", "select")


def depth(program) -> int:
    """How many single rules a program is made of (1 for a single rule)."""
    return getattr(program, "depth", 1)


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
