"""A forecast's scenario: everything a team varies, from a TOML file and the command line, resolved to the schedule
and the serving model a run uses. Pure but for reading the TOML and the profile / serving files it names.

    profile = "moe-4xL4"            # the run profile whose schedule is simulated
    serving = "my-engine.toml"      # serving model (default sim/serving_models/PROFILE.toml)
    kv_tokens = 2_000_000           # KV-cache size in tokens (replaces the serving model's)
    throughput_tok_s = 450.0        # aggregate decode tokens/s measured at...
    throughput_running = 56         # ...this many running requests (default: the serving model's max_num_seqs)
    throughput_context = 30_000     # ...each holding this many context tokens
    startup_s = 420.0               # engine start-up before the first token
    tasks = 240                     # tasks in the simulated set (made up beyond the labelled ones)
    test_inputs = 340               # test inputs in it (default: as the made-up tasks fall)
    inputs_per_task = "1:0.6,2:0.3,3:0.1"   # made-up tasks' test-input counts (default: the labelled tasks')
    throughput_noise = 0.0          # sigma of a per-run speed factor exp(N(0, sigma)) (sim.forecast)
    runs = 50
    bootstraps = 1000
    seed = 0
    sensitivity = true
    sensitivity_step = 0.05         # +5% throughput / cache per pair
    sensitivity_pairs = 20
    forced_accuracy = 0.08
    sweep = "kv_tokens=1000000,2000000"   # or "dense-27b-4xL4,moe-4xL4": profiles
    [schedule]                      # any ScheduleConfig field: caps per level, max_in_flight, rate_tok_s, ...
    cap_first_single = 96000

The throughput is converted to the step-time model by dividing every step time (a, b, c and the prefill cost) by
T / T0, where T0 is what the serving model gives at that running count and context; `describe` prints the conversion.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from sim.serving import ServingModel, load_serving
from submission import strict_toml
from submission.profiles import load_profile
from submission.schedule import ScheduleConfig

SERVING_MODELS = Path(__file__).resolve().parent / "serving_models"
SCHEDULE_FIELDS = {f.name: f.type for f in fields(ScheduleConfig)}


@dataclass(frozen=True)
class Scenario:
    profile: str = "moe-4xL4"
    serving: str | None = None
    kv_tokens: int | None = None
    throughput_tok_s: float | None = None
    throughput_running: int | None = None
    throughput_context: int = 30_000
    startup_s: float | None = None
    tasks: int = 240
    test_inputs: int | None = None
    inputs_per_task: str | None = None
    throughput_noise: float = 0.0
    runs: int = 50
    bootstraps: int = 1000
    seed: int = 0
    sensitivity: bool = False
    sensitivity_step: float = 0.05
    sensitivity_pairs: int = 20
    forced_accuracy: float = 0.08
    sweep: str | None = None
    schedule: tuple[tuple[str, object], ...] = field(default=())  # ScheduleConfig overrides

    def __post_init__(self) -> None:
        for name in ("kv_tokens", "throughput_tok_s", "throughput_running", "startup_s", "test_inputs"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ValueError(f"scenario: {name} must not be negative, got {value}")
        if self.tasks < 1 or self.runs < 1 or self.throughput_noise < 0 or self.bootstraps < 0:
            raise ValueError("scenario: tasks and runs must be positive, throughput_noise and bootstraps >= 0")
        parse_counts(self.inputs_per_task)
        for name, _ in self.schedule:
            if name not in SCHEDULE_FIELDS:
                raise ValueError(f"scenario: [schedule] has no field {name!r} (known: {sorted(SCHEDULE_FIELDS)})")

    def to_json(self) -> dict:
        out = {f.name: getattr(self, f.name) for f in fields(self) if f.name != "schedule"}
        return out | {"schedule": {k: list(v) if isinstance(v, tuple) else v for k, v in self.schedule}}


def parse_counts(text: str | None) -> tuple[tuple[int, float], ...]:
    """ "1:0.6,2:0.3,3:0.1" -> ((1, 0.6), (2, 0.3), (3, 0.1)): test inputs per task and their weights (a scenario's
    made-up tasks, sim.example_log's logged tasks)."""
    if not text:
        return ()
    try:
        pairs = tuple((int(a), float(b)) for a, b in (item.split(":") for item in text.split(",") if item))
    except ValueError:
        raise ValueError(f"inputs_per_task must be COUNT:WEIGHT,..., got {text!r}") from None
    if not pairs or any(not 1 <= c <= 4 or w < 0 for c, w in pairs) or not sum(w for _, w in pairs) > 0:
        raise ValueError(f"inputs_per_task needs counts 1-4 and positive weights, got {text!r}")
    return pairs


def _schedule_value(name: str, value):
    """A schedule field from TOML or the command line: repair_caps is a list (or "24000,16000")."""
    if name == "repair_caps":
        items = value.split(",") if isinstance(value, str) else value
        return tuple(int(v) for v in items)
    return value


def read_scenario(path: str | Path) -> dict:
    """The TOML's fields, checked by name (the values are checked when the Scenario is made)."""
    raw = strict_toml.read(path)  # a missing file or invalid TOML: TomlError (a ValueError) naming the file
    names = {f.name for f in fields(Scenario)}
    unknown = sorted(set(raw) - names)
    if unknown:
        raise strict_toml.TomlError(f"{path}: unknown key(s) {', '.join(unknown)} (known: {', '.join(sorted(names))})")
    schedule = raw.pop("schedule", {})
    if not isinstance(schedule, dict):
        raise strict_toml.TomlError(f"{path}.schedule: expected a table, got {type(schedule).__name__}")
    unknown = sorted(set(schedule) - set(SCHEDULE_FIELDS))
    if unknown:
        raise strict_toml.TomlError(f"{path}.schedule: unknown key(s) {', '.join(unknown)} (known: "
                                    f"{', '.join(sorted(SCHEDULE_FIELDS))})")
    return raw | {"schedule": tuple((k, _schedule_value(k, v)) for k, v in schedule.items())}


def make_scenario(from_file: dict, overrides: dict) -> Scenario:
    """File values, then command-line values that were given (not None); schedule overrides merge by field."""
    given = {k: v for k, v in overrides.items() if v is not None and k != "schedule"}
    given_schedule = {k: _schedule_value(k, v) for k, v in overrides.get("schedule", ())}
    schedule = dict(from_file.get("schedule", ())) | given_schedule
    merged = {k: v for k, v in from_file.items() if k != "schedule"} | given
    try:
        return Scenario(**merged, schedule=tuple(schedule.items()))
    except TypeError as err:
        raise ValueError(f"scenario: {err}") from None


def _parse(name: str, text: str):
    kind = Scenario.__dataclass_fields__[name].type if name in Scenario.__dataclass_fields__ else SCHEDULE_FIELDS[name]
    kind = str(kind)
    if name == "repair_caps":
        return tuple(int(v) for v in text.split("/"))
    if "int" in kind and "float" not in kind:
        return int(float(text))
    if "float" in kind:
        return float(text)
    if "bool" in kind:
        return text.lower() in ("1", "true", "yes")
    return text


def variants(scenario: Scenario) -> list[tuple[str, Scenario]]:
    """The base scenario and one per sweep value. `sweep` is "KEY=V1,V2" (KEY a scenario field or a schedule
    field, repair caps written 24000/16000) or a comma-separated list of profiles."""
    out = [(scenario.profile, scenario)]
    if not scenario.sweep:
        return out
    if "=" not in scenario.sweep:
        return out + [(name, replace(scenario, profile=name, serving=None)) for name in scenario.sweep.split(",")
                      if name]
    key, _, values = scenario.sweep.partition("=")
    key = key.strip().removeprefix("schedule.")
    for text in (v.strip() for v in values.split(",") if v.strip()):
        if key in SCHEDULE_FIELDS:
            variant = replace(scenario, schedule=tuple(dict(scenario.schedule, **{key: _parse(key, text)}).items()))
        elif key in Scenario.__dataclass_fields__ and key not in ("sweep", "schedule"):
            variant = replace(scenario, **{key: _parse(key, text)}) if key != "profile" else replace(
                scenario, profile=text, serving=None)
        else:
            raise ValueError(f"sweep: {key!r} is neither a scenario field nor a schedule field")
        out.append((f"{key}={text}", variant))
    return out


@dataclass(frozen=True)
class Resolved:
    schedule: ScheduleConfig
    serving: ServingModel
    notes: tuple[str, ...]  # how the scenario changed the profile's schedule and the serving model
    transfer: bool = True  # the profile's selection.transfer


def for_profile(serving: ServingModel, profile) -> ServingModel:
    """The serving model with the engine settings of the run profile that its cache model reads: chunked prefill's
    token budget (a profile's 0, vLLM's default, is read as no budget) and the speculative draft tokens."""
    return replace(serving, max_num_batched_tokens=profile.engine.max_num_batched_tokens,
                   draft_tokens=profile.engine.mtp_speculative_tokens)


def resolve(scenario: Scenario) -> Resolved:
    """The schedule and serving model the scenario means, and a line for each change it made."""
    profile = load_profile(scenario.profile)
    notes = []
    try:
        schedule = replace(profile.schedule, **dict(scenario.schedule))
    except (TypeError, ValueError) as err:
        raise ValueError(f"scenario [schedule]: {err}") from None
    for name, value in scenario.schedule:
        notes.append(f"schedule.{name} = {value} (profile: {getattr(profile.schedule, name)})")
    path = Path(scenario.serving) if scenario.serving else SERVING_MODELS / f"{Path(scenario.profile).stem}.toml"
    serving = for_profile(load_serving(path), profile)
    notes.append(f"serving model {path}; from the profile: max_num_batched_tokens {serving.max_num_batched_tokens} "
                 f"(0: no budget), draft_tokens {serving.draft_tokens}")
    if scenario.kv_tokens is not None:
        notes.append(f"kv_tokens = {scenario.kv_tokens:,} (serving model: {serving.kv_tokens:,})")
        serving = replace(serving, kv_tokens=scenario.kv_tokens)
    if scenario.startup_s is not None:
        notes.append(f"startup_s = {scenario.startup_s:g} (serving model: {serving.startup_s:g})")
        serving = replace(serving, startup_s=scenario.startup_s)
    if scenario.throughput_tok_s is not None:
        running = scenario.throughput_running or serving.max_num_seqs
        before = serving.throughput(running, scenario.throughput_context)
        factor = scenario.throughput_tok_s / before
        serving = serving.scaled(throughput=factor)
        notes.append(f"throughput {scenario.throughput_tok_s:g} tok/s at {running} running x "
                     f"{scenario.throughput_context:,} context tokens: the serving model gives {before:.1f} there, so "
                     f"every step time is divided by {factor:.3f} -> step_a {serving.step_a:.3g} s, step_b "
                     f"{serving.step_b:.3g} s, step_c {serving.step_c:.3g} s, prefill "
                     f"{serving.prefill_s_per_token:.3g} s/token")
    return Resolved(schedule, serving, tuple(notes), profile.selection.transfer)


def describe(scenario: Scenario, resolved: Resolved, inputs: int) -> str:
    s, m = resolved.schedule, resolved.serving
    lines = [f"scenario: profile {scenario.profile}, {scenario.tasks} tasks, {inputs} test inputs, "
             f"{scenario.runs} runs (seed {scenario.seed}), throughput noise {scenario.throughput_noise:g}, "
             f"{scenario.bootstraps} bootstraps",
             f"  engine: {m.kv_tokens:,} KV tokens ({m.blocks:,} blocks of {m.block_size}), max_num_seqs "
             f"{m.max_num_seqs}, start-up {m.startup_s:g} s, {m.throughput(m.max_num_seqs, 30_000):.0f} tok/s at "
             f"{m.max_num_seqs} running x 30K context",
             f"  schedule: caps L0 {s.cap_first_single:,} (single) / {s.cap_first_multi:,} (multi), L1 "
             f"{s.cap_second:,}, L2 {'/'.join(f'{c:,}' for c in s.repair_caps)}, L3 {s.cap_extra:,}; max_in_flight "
             f"{s.max_in_flight}, cap rate {s.rate_tok_s:g} tok/s"]
    lines += [f"  {note}" for note in resolved.notes]
    return "\n".join(lines)
