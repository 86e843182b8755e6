"""training/corpus on Ray (issue 32 section 1): generate's measurements and the audit's shards as Ray tasks give the
same corpus and the same findings as one process, with 1 or 2 workers. Build environment only (ray is pinned in
requirements/build-cpu.txt); one local Ray for the whole module."""

from __future__ import annotations

import pytest

from training.corpus import audit, cluster, generate
from training.corpus.family_count import CountPack
from training.corpus.family_rays import Rays
from training.corpus.family_symmetry import SymmetryRepair

ray = pytest.importorskip("ray")

PROGRAMS = [Rays("right", "wall", "mark"), Rays("cross", "wall", "mark"), SymmetryRepair("lr", "mark", "repaired"),
            CountPack("any", "row", "mark", 4)]


@pytest.fixture(scope="module")
def local_ray():
    """A local Ray on two CPUs, started and stopped once for the module (the pools below find it running)."""
    owner = cluster.RayPool(2)
    yield owner
    owner.close()
    assert not ray.is_initialized()


def _files(root):
    return {p.relative_to(root): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_one_and_two_ray_workers_give_the_bytes_of_one_process(tmp_path, local_ray):
    generate.generate(3, 1, 0, tmp_path / "serial", tries=1, programs=PROGRAMS, depth=2)
    for workers in (1, 2):
        pool = cluster.RayPool(workers)
        assert pool.window == cluster.IN_FLIGHT * workers
        generate.generate(3, 1, 0, tmp_path / f"ray{workers}", tries=1, programs=PROGRAMS, depth=2, pool=pool)
        pool.close()  # not the owner: the module's Ray keeps running
        assert ray.is_initialized()
        assert _files(tmp_path / f"ray{workers}") == _files(tmp_path / "serial"), workers


def test_the_audit_in_ray_shards_finds_what_one_process_finds(tmp_path, local_ray, arc_data, monkeypatch):
    out = tmp_path / "corpus"
    generate.generate(3, 1, 0, out, tries=1, programs=PROGRAMS, depth=2)
    monkeypatch.setattr(audit, "SHARD", 2)  # several shards even for this small corpus
    evaluation = arc_data / "arc-agi-2" / "evaluation"
    task = next((out / "tasks").glob("*.json"))
    task.write_text(task.read_text().replace("1", "2", 1))  # one task no longer replays
    serial = audit.audit(out, evaluation)
    assert [f.kind for f in serial] == ["replay"]
    assert audit.audit(out, evaluation, cluster.RayPool(2)) == serial
