"""Preflight: before the model loads, check the machine and the bundle against the run profile, in one report.

    python -m submission.kaggle.preflight --bundle DIR [--work DIR] [--stage all|machine]

A run that cannot work should stop in seconds with the reason, not an hour in (issue 12). `checks(profile, facts)`
is pure: it compares facts about the machine (GPUs and their memory, the NVIDIA driver, free disk) and the bundle (the
model's config.json, its size, the manifest) with what the profile asks for. `gather(bundle, work)` collects those
facts (nvidia-smi, the file system) and is the only part that does I/O, so tests fake the facts. boot.py runs this
module after the wheels are installed and before the solver: exit status 1 means refused, and the report says why.

`--stage machine` checks only what needs neither wheels nor model: the GPUs the profile needs (tensor x pipeline
parallel, the grid line's devices, a combined profile's split) and the NVIDIA driver against the lock's CUDA major
(`machine_checks`, pure; it reads nvidia-smi, kit/bundle.json and manifest.json). This module and the profile loaders
import only the standard library (numpy is imported where it is used), so the stage runs under Kaggle's bare Python
before the 4 GB wheel install (issue 27) and a wrong machine is refused in seconds, not after the install.

The memory check is an estimate (weights split evenly over tensor x pipeline ranks, plus the profile's KV cache,
against vLLM's default 90% of each GPU's memory); activations and CUDA graphs are not counted. A grid-line profile
(`line = "grid"`, submission/grid/) needs one GPU per distinct CUDA device of `run.devices`, each holding the whole
model (its TTT adapter, activations and the search's KV cache are not counted), and a 16-token grid model. A
combined profile (`line = "both"`, a bundle with model/ and grid-model/) is checked as its two lines on their shares
of the machine: the GPU split first (`reasoning.devices` and `grid.devices` name disjoint GPUs that this machine has),
then each line's own checks above against the GPUs its share makes visible and its own model, then the disk and the
bundle once.
"""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, replace
from pathlib import Path

from submission.kaggle.bundle_files import MODEL_DIRS, split_parts
from submission.reasoning.profile import Profile
from submission.grid.profile import GridProfile
from submission.grid.format import VOCAB
from submission.profiles import BothProfile, ProfileError, line_configs, load, path_of

GIB = 2**30
# CUDA 13 wheels (the kaggle-gpu locks: nvidia-cuda-runtime 13.x) need an R580 driver or newer (CUDA 13.0's minor-
# version compatibility floor; the 13.0 toolkit itself shipped with 580.65.06).
MIN_DRIVER = {13: 580, 12: 525}
GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of each GPU
DISK_MARGIN = 1 * GIB  # besides the reassembled files: logs, the answer file, pip's caches
EXPERT_KEYS = ("num_experts", "n_routed_experts", "num_local_experts")
MTP_KEYS = ("num_nextn_predict_layers", "mtp_num_hidden_layers")


@dataclass(frozen=True)
class Gpu:
    name: str
    memory_bytes: int


@dataclass(frozen=True)
class Machine:
    """The machine stage's facts: the GPUs and driver nvidia-smi reports, and the CUDA major of the bundle's lock."""

    gpus: tuple[Gpu, ...]
    driver: str | None  # NVIDIA driver version ("580.82.07"); None: no nvidia-smi
    cuda: int | None  # cuda_major of the manifest's lock; None: CPU-only wheels


@dataclass(frozen=True)
class Facts:
    """What preflight knows of the machine and the bundle; `gather` reads them, tests make them up."""

    gpus: tuple[Gpu, ...]
    driver: str | None  # NVIDIA driver version ("580.82.07"); None: no nvidia-smi
    free_disk_bytes: int  # in the working folder, where split files are reassembled
    split_bytes: int  # bytes of the bundle's split files (to be reassembled)
    model_bytes: int  # the model folder's safetensors files
    model_config: dict | None  # the model folder's config.json; None: missing or unreadable
    manifest: dict  # the bundle's manifest.json (target, lock, profile, model provenance)
    bundle_profile: str  # the profile kit/bundle.json names
    model_dir: str = MODEL_DIRS[0]  # the folder model_bytes and model_config come from (a combined bundle: two)

    @property
    def machine(self) -> Machine:
        return Machine(self.gpus, self.driver, cuda_major(self.manifest.get("lock", "")))


@dataclass(frozen=True)
class Check:
    name: str
    ok: bool
    detail: str


def cuda_major(lock: str) -> int | None:
    """The CUDA major version the locked wheels link (nvidia-cuda-runtime), None for a CPU-only lock."""
    found = re.search(r"^nvidia-cuda-runtime(?:-cu\d+)?==(\d+)\.", lock, re.MULTILINE)
    return int(found.group(1)) if found else None


def gpus_needed(profile: Profile | GridProfile, cuda: int | None) -> int:
    """GPUs the profile's engine (or the grid line's workers) uses on this bundle's target: none for a CPU-only
    lock."""
    if cuda is None:
        return 0
    if isinstance(profile, GridProfile):
        return len({d for d in profile.run.devices if d.startswith("cuda")})
    e = profile.engine
    return e.tensor_parallel_size * e.pipeline_parallel_size if e.kind == "vllm" else 1


def _config_value(config: dict, keys: tuple[str, ...]) -> int | None:
    for where in (config, config.get("text_config") or {}):
        for key in keys:
            if isinstance(where.get(key), int):
                return where[key]
    return None


def checks(profile: Profile | GridProfile, facts: Facts) -> list[Check]:
    """Every check, passed or not, in report order. Pure."""
    return [*_gpu_checks(profile, facts), _disk_check(facts), *_line_model_checks(profile, facts),
            _bundle_check(profile.name, facts)]


def _gpu_checks(profile: Profile | GridProfile, facts: Facts) -> list[Check]:
    """The GPU count, the memory estimate and the driver for one line on the GPUs of `facts`."""
    count, *driver = machine_checks(profile, facts.machine)
    needed = gpus_needed(profile, facts.machine.cuda)
    return [count, *([_memory_check(profile, facts, needed)] if needed else []), *driver]


def machine_checks(profile: Profile | GridProfile, machine: Machine) -> list[Check]:
    """The GPU count and, with CUDA wheels, the driver for one line on the GPUs of `machine`. Pure."""
    cuda = machine.cuda
    needed = gpus_needed(profile, cuda)
    found = len(machine.gpus)
    names = ", ".join(sorted({g.name for g in machine.gpus})) or "none"
    out = [Check("GPUs", found >= needed, f"{found} found ({names}), the profile {profile.name} needs {needed}"
                 + ("" if cuda else " (CPU-only wheels)"))]
    if needed:
        floor = MIN_DRIVER.get(cuda)
        driver = machine.driver
        major = int(driver.split(".")[0]) if driver and driver.split(".")[0].isdigit() else None
        out.append(Check("NVIDIA driver", major is not None and (floor is None or major >= floor),
                         f"{driver or 'not found (no nvidia-smi)'}; the CUDA {cuda} wheels need "
                         f"{floor or '?'} or newer"))
    return out


def _memory_check(profile: Profile | GridProfile, facts: Facts, needed: int) -> Check:
    usable = min((g.memory_bytes for g in facts.gpus), default=0) * GPU_MEMORY_UTILIZATION
    if isinstance(profile, GridProfile):
        per_gpu = facts.model_bytes
        detail = f"weights {per_gpu / GIB:.1f} GiB on each worker's GPU (TTT, activations, KV cache not counted)"
    else:
        ranks = needed if profile.engine.kind == "vllm" else 1
        per_gpu = facts.model_bytes / ranks + profile.engine.kv_cache_memory_bytes
        detail = (f"about {per_gpu / GIB:.1f} GiB per GPU (weights {facts.model_bytes / GIB:.1f} GiB over "
                  f"{ranks}, KV cache {profile.engine.kv_cache_memory_bytes / GIB:.1f} GiB)")
    return Check("GPU memory", per_gpu <= usable, f"{detail} of {usable / GIB:.1f} GiB usable (estimate)")


def _disk_check(facts: Facts) -> Check:
    need_disk = facts.split_bytes + DISK_MARGIN
    return Check("disk", facts.free_disk_bytes >= need_disk,
                 f"{facts.free_disk_bytes / GIB:.1f} GiB free, {need_disk / GIB:.1f} GiB needed (split files "
                 f"{facts.split_bytes / GIB:.1f} GiB + {DISK_MARGIN / GIB:.0f} GiB)")


def _bundle_check(name: str, facts: Facts) -> Check:
    named = facts.manifest.get("profile")
    return Check("bundle", named == facts.bundle_profile == name,
                 f"manifest profile {named}, kit/bundle.json {facts.bundle_profile}, running {name}; "
                 f"target {facts.manifest.get('target', '?')}, kit commit "
                 f"{str(facts.manifest.get('kit_commit', '?'))[:12]}")


def _line_model_checks(profile: Profile | GridProfile, facts: Facts) -> list[Check]:
    return _grid_model_checks(facts) if isinstance(profile, GridProfile) else _model_checks(profile, facts)


def _missing_config(facts: Facts) -> Check:
    return Check("model config", False, f"{facts.model_dir}/config.json is missing or not JSON")


def _grid_model_checks(facts: Facts) -> list[Check]:
    config = facts.model_config
    if config is None:
        return [_missing_config(facts)]
    architectures = config.get("architectures") or []
    return [Check("model architecture", bool(architectures), ", ".join(architectures) or "none in config.json"),
            Check("grid vocabulary", config.get("vocab_size") == VOCAB,
                  f"config.json: vocab_size {config.get('vocab_size')}; the grid line needs {VOCAB} "
                  f"(build.models.grid_vocab)")]


def _model_checks(profile: Profile, facts: Facts) -> list[Check]:
    config = facts.model_config
    if config is None:
        return [_missing_config(facts)]
    architectures = config.get("architectures") or []
    experts = _config_value(config, EXPERT_KEYS)
    out = [Check("model architecture", bool(architectures),
                 f"{', '.join(architectures) or 'none in config.json'}"
                 + (f", {experts} experts per layer" if experts else ", dense"))]
    if profile.engine.enable_expert_parallel:
        out.append(Check("expert parallelism", experts is not None,
                         "the profile shards experts; the model " + ("has them" if experts else "has none")))
    pruning = (facts.manifest.get("model") or {}).get("pruning")
    if pruning:
        kept = pruning.get("experts_per_layer")
        out.append(Check("expert count", experts == kept,
                         f"config.json says {experts}, the pruning record {kept} ({pruning.get('list_name')})"))
    quantised = "quantization_config" in config
    wanted = bool(profile.build.recipe) or bool((facts.manifest.get("model") or {}).get("quantization"))
    scheme = (config.get("quantization_config") or {}).get("quant_method", "")
    out.append(Check("quantisation", quantised or not wanted,
                     f"config.json: {scheme or 'none'}; the profile's recipe: {profile.build.recipe or 'none'}"))
    if profile.engine.mtp_speculative_tokens:
        layers = _config_value(config, MTP_KEYS)
        out.append(Check("MTP layer", bool(layers),
                         f"{profile.engine.mtp_speculative_tokens} draft tokens asked; config.json has "
                         f"{layers or 'no'} MTP layer(s)"))
    return out


def gpu_indices(value: str) -> tuple[int, ...] | None:
    """The GPUs a CUDA_VISIBLE_DEVICES value names ("2,3" -> (2, 3)); None unless it is a list of indices."""
    parts = [part.strip() for part in value.split(",")]
    return tuple(int(part) for part in parts) if value.strip() and all(p.isdigit() for p in parts) else None


def gpu_split(both: BothProfile, where: str, found: int) -> Check:
    """Whether `reasoning.devices` and `grid.devices` of a combined profile (file `where`) give each line its own
    GPUs, all of them among the `found` ones. An empty value is every GPU, which the other line uses too."""
    fields = {"reasoning.devices": both.reasoning.devices, "grid.devices": both.grid.devices}
    problems = []
    for key, value in fields.items():
        if not value.strip():
            problems.append(f"{key} is empty (every GPU, shared with the other line): give each line its own, "
                            f"e.g. \"0,1\" and \"2,3\"")
        elif gpu_indices(value) is None:
            problems.append(f"{key} {value!r}: expected GPU indices such as \"2,3\"")
        elif max(gpu_indices(value)) >= found:
            problems.append(f"{key} {value!r} names GPU {max(gpu_indices(value))}, but {found} found")
    sides = [set(gpu_indices(v) or ()) for v in fields.values()]
    if sides[0] & sides[1]:
        problems.append(f"reasoning.devices {both.reasoning.devices!r} and grid.devices {both.grid.devices!r} share "
                        f"GPU {', '.join(map(str, sorted(sides[0] & sides[1])))}")
    detail = (f"{where}: " + "; ".join(problems)) if problems else (
        f"reasoning line GPUs {both.reasoning.devices}, grid line GPUs {both.grid.devices} of {found} ({where})")
    return Check("GPU split", not problems, detail)


def both_checks(both: BothProfile, lines: tuple[Profile, GridProfile], where: str, facts: Facts,
                grid_facts: Facts) -> list[Check]:
    """A combined profile's checks (`where`: its file; `lines`: its line profiles with their shares, line_configs),
    pure: the GPU split (with CUDA wheels), then each line's GPU and model checks as `checks` makes them, on the GPUs
    its share makes visible (`facts`: the reasoning model, `grid_facts`: the grid model, the same machine), then the
    disk and the bundle once."""
    reasoning, grid = lines
    out = []
    cuda = cuda_major(facts.manifest.get("lock", ""))
    if cuda is not None:
        out.append(gpu_split(both, where, len(facts.gpus)))
    for name, profile, seen, devices in (("reasoning", reasoning, facts, both.reasoning.devices),
                                         ("grid", grid, grid_facts, both.grid.devices)):
        seen = replace(seen, gpus=visible_gpus(seen.gpus, devices))
        out += [replace(c, name=f"{name} line: {c.name}")
                for c in _gpu_checks(profile, seen) + _line_model_checks(profile, seen)]
    return out + [_disk_check(facts), _bundle_check(both.name, facts)]


def both_machine_checks(both: BothProfile, lines: tuple[Profile, GridProfile], where: str,
                        machine: Machine) -> list[Check]:
    """A combined profile's machine stage, pure: the GPU split (with CUDA wheels), then each line's GPU count and
    driver on the GPUs its share makes visible, named as both_checks names them."""
    out = [gpu_split(both, where, len(machine.gpus))] if machine.cuda is not None else []
    for name, profile, devices in (("reasoning", lines[0], both.reasoning.devices),
                                   ("grid", lines[1], both.grid.devices)):
        seen = replace(machine, gpus=visible_gpus(machine.gpus, devices))
        out += [replace(c, name=f"{name} line: {c.name}") for c in machine_checks(profile, seen)]
    return out


def visible_gpus(gpus: tuple[Gpu, ...], devices: str) -> tuple[Gpu, ...]:
    """The GPUs a line's CUDA_VISIBLE_DEVICES value leaves it (every one when the value names no indices)."""
    visible = gpu_indices(devices)
    return gpus if visible is None else tuple(gpus[i] for i in visible if i < len(gpus))


def report(results: list[Check]) -> str:
    lines = [f"  {'ok  ' if c.ok else 'FAIL'} {c.name}: {c.detail}" for c in results]
    verdict = "preflight: ok" if all(c.ok for c in results) else "preflight: REFUSED, the run cannot work here"
    return "\n".join([verdict, *lines])


NVIDIA_SMI = ["nvidia-smi", "--query-gpu=name,memory.total,driver_version", "--format=csv,noheader,nounits"]


def parse_nvidia_smi(text: str) -> tuple[tuple[Gpu, ...], str | None]:
    """GPUs and the driver version from NVIDIA_SMI's output ("NVIDIA L4, 23034, 580.82.07" per GPU, MiB). Pure."""
    rows = [[part.strip() for part in line.split(",")] for line in text.splitlines() if line.strip()]
    rows = [r for r in rows if len(r) == 3 and r[1].isdigit()]
    return tuple(Gpu(r[0], int(r[1]) * 2**20) for r in rows), (rows[0][2] if rows else None)


def _nvidia_smi() -> tuple[tuple[Gpu, ...], str | None]:
    try:
        result = subprocess.run(NVIDIA_SMI, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return (), None
    return parse_nvidia_smi(result.stdout)


def gather_machine(bundle: Path) -> tuple[str, Machine]:
    """The bundle's profile name (kit/bundle.json) and this machine's facts for it (nvidia-smi, manifest.json's lock):
    what the machine stage reads, before the wheels are installed."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    profile = json.loads((bundle / "kit" / "bundle.json").read_text())["profile"]
    gpus, driver = _nvidia_smi()
    return profile, Machine(gpus, driver, cuda_major(manifest.get("lock", "")))


def gather(bundle: Path, work: Path) -> Facts:
    """The facts of this machine and bundle (nvidia-smi, the file system); seconds, nothing is hashed."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    gpus, driver = _nvidia_smi()
    work.mkdir(parents=True, exist_ok=True)
    return Facts(
        gpus=gpus, driver=driver, free_disk_bytes=shutil.disk_usage(work).free,
        split_bytes=sum(manifest["files"][part]["bytes"] for parts in split_parts(manifest).values()
                        for part in parts),  # the joined files boot writes (bundle_files.join_split_files)
        **model_facts(bundle, MODEL_DIRS[0]), manifest=manifest,
        bundle_profile=json.loads((bundle / "kit" / "bundle.json").read_text())["profile"])


def model_facts(bundle: Path, folder: str) -> dict:
    """Facts' model fields for one of the bundle's model folders (a missing folder: no bytes, no config)."""
    files = [p for p in (bundle / folder).rglob("*") if p.is_file()]
    try:
        config = json.loads((bundle / folder / "config.json").read_text())
    except (OSError, ValueError):
        config = None
    return {"model_dir": folder, "model_config": config,
            "model_bytes": sum(p.stat().st_size for p in files if ".safetensors" in p.name)}  # split parts included


def machine_stage(bundle: Path) -> list[Check]:
    """The machine stage's checks for the bundle's profile (standard library only: see the module's docstring)."""
    name, machine = gather_machine(bundle)
    profile = load(name)
    if isinstance(profile, BothProfile):
        return both_machine_checks(profile, line_configs(profile), str(path_of(name)), machine)
    return machine_checks(profile, machine)


def full_stage(bundle: Path, work: Path) -> list[Check]:
    facts = gather(bundle, work)
    profile = load(facts.bundle_profile)
    if isinstance(profile, BothProfile):
        return both_checks(profile, line_configs(profile), str(path_of(facts.bundle_profile)), facts,
                           replace(facts, **model_facts(bundle, MODEL_DIRS[1])))
    return checks(profile, facts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m submission.kaggle.preflight", description=__doc__.split("\n\n")[0])
    parser.add_argument("--bundle", required=True, type=Path, help="the bundle (dataset) folder")
    parser.add_argument("--work", type=Path, default=Path("/kaggle/arc-kit-work"),
                        help="where split files will be reassembled (its free disk is checked)")
    parser.add_argument("--stage", choices=("all", "machine"), default="all",
                        help="machine: only the GPUs and the driver, with no wheels installed (before the install)")
    args = parser.parse_args(argv)
    try:
        results = machine_stage(args.bundle) if args.stage == "machine" else full_stage(args.bundle, args.work)
    except (OSError, ValueError, KeyError, ProfileError) as err:
        print(f"preflight: REFUSED, cannot read the bundle {args.bundle}: {err}")
        return 1
    print(report(results))
    return 0 if all(c.ok for c in results) else 1


if __name__ == "__main__":
    sys.exit(main())
