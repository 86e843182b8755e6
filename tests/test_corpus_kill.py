"""training/corpus generate under SIGKILL (issue 32 section 3): killed just before every write of a small run, each
kill resumed by the same command, the folder ends byte-identical to an unkilled run."""

from __future__ import annotations

import os
import signal

import pytest

from training.corpus import dsl, generate, store
from training.corpus.family_rays import Rays
from training.corpus.family_symmetry import SymmetryRepair

PROGRAMS = [Rays("right", "wall", "mark"), Rays("cross", "wall", "mark"), SymmetryRepair("lr", "mark", "repaired")]


def _run(out):
    generate.generate(2, 1, 0, out, tries=1, programs=PROGRAMS, depth=2)


def _files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _killed_at(out, step: str) -> int:
    """Run in a forked child with CORPUS_KILL_AT=step; its wait status."""
    pid = os.fork()
    if pid == 0:  # the child never returns into pytest
        code = 3
        try:
            store.reset()
            os.environ[store.KILL_AT] = step
            _run(out)
            code = 0
        finally:
            os._exit(code)
    return os.waitpid(pid, 0)[1]


@pytest.fixture
def memoised(monkeypatch):
    """The measurements, memoised: they are pure, and the ledger's writes are what is under test (without this the
    forty runs would take minutes)."""
    for name in ("_measure", "_gate_rule"):
        real, seen = getattr(generate, name), {}

        def cached(job, real=real, seen=seen):
            key = (dsl.canonical_json(job) if not isinstance(job, tuple) else
                   (dsl.canonical_json(job[0]), tuple(dsl.canonical_json(r) for r in job[1]), *job[2:]))
            if key not in seen:
                seen[key] = real(job)
            return seen[key]

        monkeypatch.setattr(generate, name, cached)


def test_a_kill_before_any_write_resumes_to_the_unkilled_corpus(tmp_path, memoised):
    store.reset()
    _run(tmp_path / "whole")
    whole = _files(tmp_path / "whole")
    steps = list(store.taken)
    # every kind of write: the run (segment), each admission shard's rows and entry (a kill between the matrix and
    # its index), each task file and gate record, and the outputs
    assert set(steps) == {"segment", "rows", "entry", "task", "gated", "manifest", "report", "plot"}
    seen: dict[str, int] = {}
    for name in steps:
        seen[name] = seen.get(name, 0) + 1
        at = f"{name}:{seen[name]}"
        out = tmp_path / at.replace(":", "-")
        status = _killed_at(out, at)
        assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL, at
        assert _files(out) != whole, at  # the kill left the run unfinished
        store.reset()
        _run(out)  # the same command, started again
        assert _files(out) == whole, at
