"""The solver's heartbeat (submission/heartbeat.py), which boot's supervisor reads."""

from __future__ import annotations

import os

import pytest

from submission import heartbeat as hb


def beat(phase="solving", attempts=0, queued=5, running=2, tokens=0, quiet_s=0.0) -> hb.Heartbeat:
    return hb.Heartbeat(phase, 1234, 0.0, 0.0, attempts, queued, running, tokens, quiet_s)


# --- the heartbeat -----------------------------------------------------------------------------------------------

def test_a_heartbeat_round_trips_and_a_broken_one_is_refused_with_its_reason(tmp_path):
    path = tmp_path / "attempts.heartbeat.json"
    assert hb.path_for_log(tmp_path / "attempts.jsonl") == path
    writer = hb.HeartbeatWriter(path)
    writer.beat("solving", attempts=3, queued=2, running=1, engine_tokens=99, quiet_s=5.0)
    got = hb.read(path)
    assert (got.phase, got.pid, got.attempts, got.queued, got.running, got.engine_tokens, got.quiet_s) == (
        "solving", os.getpid(), 3, 2, 1, 99, 5.0)
    assert hb.parse(hb.render(got)) == got
    for text, says in [("{", "not JSON"), ("[1]", "not a JSON object"), ('{"phase": "x"}', "lacks"),
                       ('{"phase": "nap", "pid": 1, "time": 0, "phase_s": 0}', "phase 'nap'"),
                       ('{"phase": "done", "pid": -1, "time": 0, "phase_s": 0}', "pid"),
                       ('{"phase": "done", "pid": 1, "time": 0, "phase_s": 0, "attempts": 1.5}', "attempts"),
                       ('{"phase": "done", "pid": 1, "time": 0, "phase_s": 0, "mood": 1}', "unknown")]:
        with pytest.raises(hb.HeartbeatError, match=says):
            hb.parse(text)
    with pytest.raises(ValueError):
        writer.beat("napping")
    hb.HeartbeatWriter(None).beat("done")  # no path: nothing written, nothing raised


def test_a_heartbeat_write_never_raises_and_falls_back_to_in_place_on_a_full_disk(tmp_path, monkeypatch):
    path = tmp_path / "hb.json"
    first = beat(attempts=1)
    assert hb.write(path, first)

    def full(*_):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(hb.os, "replace", full)  # the atomic path fails as on a full disk
    assert hb.write(path, beat(attempts=2))
    assert hb.read(path).attempts == 2 and not list(tmp_path.glob(".*tmp"))
    assert not hb.write(tmp_path / "missing-folder" / "hb.json", first)  # nothing works: False, no exception


def test_combined_heartbeats_take_the_most_advanced_phase_and_sum_the_counts():
    phase, counts = hb.combine([beat("engine-start", 1, 2, 0, 10, 50.0), beat("solving", 3, 4, 2, 5)])
    assert phase == "solving"
    assert counts == {"attempts": 4, "queued": 6, "running": 2, "engine_tokens": 15, "quiet_s": 50.0}
    assert hb.combine([]) == ("loading", {})
