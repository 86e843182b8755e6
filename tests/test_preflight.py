"""Preflight (submission/kaggle/preflight.py): the pure checks on faked machines (device list, driver, disk, model
config) against the shipped profiles and the committed locks, and the command on a bundle folder on this machine."""

from __future__ import annotations

import json
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from submission.kaggle.preflight import GIB, Facts, Gpu, checks, cuda_major, gather, parse_nvidia_smi, report
from submission.profiles import load_grid_profile, load_profile

REPO = Path(__file__).resolve().parents[1]
GPU_LOCK = (REPO / "offline_wheels" / "locks" / "kaggle-gpu-py311.txt").read_text()
CPU_LOCK = (REPO / "offline_wheels" / "locks" / "cpu-py311.txt").read_text()
L4 = Gpu("NVIDIA L4", 23034 * 2**20)  # nvidia-smi's memory.total of an L4, in MiB
MOE_CONFIG = {"architectures": ["Qwen3NextForCausalLM"], "num_experts": 288, "mtp_num_hidden_layers": 1,
              "quantization_config": {"quant_method": "compressed-tensors"}}


def kaggle_moe(**changes) -> Facts:
    """The moe-4xL4 bundle on a Kaggle box as it should be: four L4s, an R580 driver, a pruned, quantised model."""
    facts = Facts(gpus=(L4,) * 4, driver="580.82.07", free_disk_bytes=80 * GIB, split_bytes=0,
                  model_bytes=40 * GIB, model_config=MOE_CONFIG,
                  manifest={"lock": GPU_LOCK, "profile": "moe-4xL4", "target": "kaggle-gpu-py311",
                            "kit_commit": "0123456789abcdef",
                            "model": {"pruning": {"experts_per_layer": 288, "list_name": "c8"},
                                      "quantization": {"recipe": "build/recipes/moe-4xL4.toml"}}},
                  bundle_profile="moe-4xL4")
    return replace(facts, **changes)


def failed(profile_name: str, facts: Facts) -> dict[str, str]:
    return {c.name: c.detail for c in checks(load_profile(profile_name), facts) if not c.ok}


def test_the_locks_name_their_cuda():
    assert cuda_major(GPU_LOCK) == 13 and cuda_major(CPU_LOCK) is None


def test_nvidia_smi_output_is_read():
    text = "NVIDIA L4, 23034, 580.82.07\nNVIDIA L4, 23034, 580.82.07\n"
    assert parse_nvidia_smi(text) == ((L4, L4), "580.82.07")
    assert parse_nvidia_smi("") == ((), None)
    failed_smi = "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver."
    assert parse_nvidia_smi(failed_smi) == ((), None)


def test_a_sound_kaggle_box_passes_every_check():
    results = checks(load_profile("moe-4xL4"), kaggle_moe())
    assert [c.name for c in results if not c.ok] == []
    assert {"GPUs", "GPU memory", "NVIDIA driver", "disk", "expert count", "quantisation", "MTP layer",
            "bundle"} <= {c.name for c in results}
    assert report(results).startswith("preflight: ok")


@pytest.mark.parametrize("profile", ["moe-4xL4", "dense-27b-4xL4"])
def test_more_gpus_asked_than_found_is_refused(profile):
    facts = kaggle_moe(gpus=(L4, L4), manifest={**kaggle_moe().manifest, "profile": profile},
                       bundle_profile=profile)
    problems = failed(profile, facts)
    assert "2 found (NVIDIA L4), the profile " + profile + " needs 4" in problems["GPUs"]
    assert "REFUSED" in report(checks(load_profile(profile), facts))
    assert failed(profile, replace(facts, gpus=())).keys() >= {"GPUs", "GPU memory"}


def test_the_driver_disk_and_memory_are_measured_against_the_bundle():
    assert "the CUDA 13 wheels need 580" in failed("moe-4xL4", kaggle_moe(driver="550.54.15"))["NVIDIA driver"]
    assert "not found" in failed("moe-4xL4", kaggle_moe(driver=None))["NVIDIA driver"]
    low_disk = failed("moe-4xL4", kaggle_moe(split_bytes=30 * GIB, free_disk_bytes=20 * GIB))
    assert "20.0 GiB free, 31.0 GiB needed" in low_disk["disk"]
    assert "of 20.2 GiB usable" in failed("moe-4xL4", kaggle_moe(model_bytes=90 * GIB))["GPU memory"]


def test_the_model_config_is_checked_against_the_profile():
    unpruned = failed("moe-4xL4", kaggle_moe(model_config={**MOE_CONFIG, "num_experts": 512}))
    assert "config.json says 512, the pruning record 288" in unpruned["expert count"]
    plain = {k: v for k, v in MOE_CONFIG.items() if k != "quantization_config"}
    assert "recipe: build/recipes/moe-4xL4.toml" in failed("moe-4xL4", kaggle_moe(model_config=plain))["quantisation"]
    no_mtp = {k: v for k, v in MOE_CONFIG.items() if k != "mtp_num_hidden_layers"}
    assert "4 draft tokens asked" in failed("moe-4xL4", kaggle_moe(model_config=no_mtp))["MTP layer"]
    dense = {"architectures": ["Qwen3ForCausalLM"], "quantization_config": {"quant_method": "compressed-tensors"}}
    assert "has none" in failed("moe-4xL4", kaggle_moe(model_config=dense))["expert parallelism"]
    assert failed("moe-4xL4", kaggle_moe(model_config=None)) == {"model config": "model/config.json is missing "
                                                                                 "or not JSON"}
    other = kaggle_moe(bundle_profile="dense-27b-4xL4")
    assert "kit/bundle.json dense-27b-4xL4" in failed("moe-4xL4", other)["bundle"]


def test_a_cpu_bundle_needs_no_gpu():
    facts = Facts(gpus=(), driver=None, free_disk_bytes=10 * GIB, split_bytes=0, model_bytes=GIB // 100,
                  model_config={"architectures": ["Qwen3ForCausalLM"]},
                  manifest={"lock": CPU_LOCK, "profile": "cpu-tiny", "model": {}}, bundle_profile="cpu-tiny")
    results = checks(load_profile("cpu-tiny"), facts)
    assert all(c.ok for c in results) and "CPU-only wheels" in results[0].detail


def test_a_grid_bundle_needs_a_gpu_per_worker_and_the_grid_vocabulary():
    grid_config = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 16}
    facts = Facts(gpus=(L4,) * 4, driver="580.82.07", free_disk_bytes=80 * GIB, split_bytes=0, model_bytes=8 * GIB,
                  model_config=grid_config, manifest={"lock": GPU_LOCK, "profile": "grid-4b-4xL4", "model": {}},
                  bundle_profile="grid-4b-4xL4")
    profile = load_grid_profile("grid-4b-4xL4")
    results = checks(profile, facts)
    assert [c.name for c in results if not c.ok] == [] and "needs 4" in results[0].detail
    assert {"GPU memory", "NVIDIA driver", "grid vocabulary", "bundle"} <= {c.name for c in results}
    bad = {c.name: c.detail for c in checks(profile, replace(facts, gpus=(L4,) * 2, model_bytes=30 * GIB,
                                                             model_config={**grid_config, "vocab_size": 151936}))
           if not c.ok}
    assert set(bad) == {"GPUs", "GPU memory", "grid vocabulary"} and "build.models.grid_vocab" in bad["grid vocabulary"]
    cpu = replace(facts, gpus=(), driver=None, manifest={"lock": CPU_LOCK, "profile": "grid-tiny", "model": {}},
                  bundle_profile="grid-tiny")
    results = checks(load_grid_profile("grid-tiny"), cpu)
    assert all(c.ok for c in results) and "CPU-only wheels" in results[0].detail


def fake_bundle(root: Path, profile: str, lock: str, config: dict) -> Path:
    """The parts of a bundle that preflight reads, with the model's weights split in two parts."""
    (root / "kit").mkdir(parents=True)
    (root / "model").mkdir()
    (root / "kit" / "bundle.json").write_text(json.dumps({"profile": profile}))
    (root / "model" / "config.json").write_text(json.dumps(config))
    for number in range(2):
        (root / "model" / f"model.safetensors.part{number:03d}").write_bytes(b"\0" * 1000)
    files = {str(p.relative_to(root)): {"bytes": p.stat().st_size, "sha256": ""} for p in root.rglob("*")
             if p.is_file()}
    (root / "manifest.json").write_text(json.dumps({"lock": lock, "profile": profile, "target": "t", "model": {},
                                                    "split_part_suffix": ".part", "files": files}))
    return root


def test_gather_reads_the_bundle(tmp_path):
    bundle = fake_bundle(tmp_path / "b", "cpu-tiny", CPU_LOCK, {"architectures": ["Qwen3ForCausalLM"]})
    facts = gather(bundle, tmp_path / "work")
    assert (facts.split_bytes, facts.model_bytes, facts.bundle_profile) == (2000, 2000, "cpu-tiny")
    assert facts.model_config == {"architectures": ["Qwen3ForCausalLM"]} and facts.free_disk_bytes > 0


def test_the_command_refuses_a_four_gpu_profile_on_this_machine(tmp_path):
    """End to end on this machine (no GPU here; one on a lent GPU box): the MoE profile needs four."""
    ok = fake_bundle(tmp_path / "cpu", "cpu-tiny", CPU_LOCK, {"architectures": ["Qwen3ForCausalLM"]})
    moe = fake_bundle(tmp_path / "moe", "moe-4xL4", GPU_LOCK, MOE_CONFIG)
    command = [sys.executable, "-m", "submission.kaggle.preflight", "--work", str(tmp_path / "work"), "--bundle"]
    passed = subprocess.run(command + [str(ok)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert passed.returncode == 0 and passed.stdout.startswith("preflight: ok"), passed.stdout + passed.stderr
    refused = subprocess.run(command + [str(moe)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1 and "FAIL GPUs" in refused.stdout and "needs 4" in refused.stdout
    grid = fake_bundle(tmp_path / "grid", "grid-tiny", CPU_LOCK, {"architectures": ["Qwen3ForCausalLM"],
                                                                 "vocab_size": 16})
    passed = subprocess.run(command + [str(grid)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert passed.returncode == 0 and "ok   grid vocabulary" in passed.stdout, passed.stdout + passed.stderr


GRID_CONFIG = {"architectures": ["Qwen3ForCausalLM"], "vocab_size": 16}


def kaggle_both(**changes) -> tuple[Facts, Facts]:
    """The both-4xL4 bundle on four L4s: the dense 27B (quantised) in model/, the 4B grid model in grid-model/."""
    facts = Facts(gpus=(L4,) * 4, driver="580.82.07", free_disk_bytes=80 * GIB, split_bytes=0, model_bytes=16 * GIB,
                  model_config={"architectures": ["Qwen3ForCausalLM"], "mtp_num_hidden_layers": 1,
                                "quantization_config": {"quant_method": "compressed-tensors"}},
                  manifest={"lock": GPU_LOCK, "profile": "both-4xL4", "target": "kaggle-gpu-py311", "model": {}},
                  bundle_profile="both-4xL4")
    facts = replace(facts, **changes)
    return facts, replace(facts, model_dir="grid-model", model_bytes=8 * GIB, model_config=GRID_CONFIG)


def both_failed(profile, facts: Facts, grid_facts: Facts) -> dict[str, str]:
    from submission.kaggle.preflight import both_checks
    from submission.profiles import line_configs, load_both_profile

    both = load_both_profile(profile)
    return {c.name: c.detail for c in both_checks(both, line_configs(both), str(profile), facts, grid_facts)
            if not c.ok}


def test_a_combined_bundle_checks_each_line_on_its_share_of_the_gpus():
    from submission.kaggle.preflight import both_checks
    from submission.profiles import line_configs, load_both_profile

    both = load_both_profile("both-4xL4")
    results = both_checks(both, line_configs(both), "profiles/both-4xL4.toml", *kaggle_both())
    assert [c.name for c in results if not c.ok] == [], report(results)
    details = {c.name: c.detail for c in results}
    assert details["GPU split"].startswith("reasoning line GPUs 0,1, grid line GPUs 2,3 of 4")
    # each line sees two GPUs and needs two: the reasoning line's TP 2, the grid line's two workers
    assert "2 found (NVIDIA L4), the profile both-4xL4-reasoning needs 2" in details["reasoning line: GPUs"]
    assert "2 found (NVIDIA L4), the profile both-4xL4-grid needs 2" in details["grid line: GPUs"]
    assert "weights 16.0 GiB over 2" in details["reasoning line: GPU memory"]
    assert {"reasoning line: quantisation", "grid line: grid vocabulary", "disk", "bundle"} <= set(details)
    # the memory estimate is each line's on its own GPUs: the 16 GiB model fits over two, not a 24 GiB grid model
    facts, grid_facts = kaggle_both(model_bytes=44 * GIB)
    assert set(both_failed("both-4xL4", facts, replace(grid_facts, model_bytes=24 * GIB))) == {
        "reasoning line: GPU memory", "grid line: GPU memory"}


def test_a_combined_bundle_refuses_overlapping_or_missing_gpus_naming_the_file_and_field(tmp_path):
    path = tmp_path / "both-overlap.toml"
    path.write_text('line = "both"\n[reasoning]\nprofile = "dense-27b-4xL4"\ndevices = "0,1"\n'
                    'tensor_parallel_size = 2\n[grid]\nprofile = "grid-4b-4xL4"\ndevices = "1,2"\n'
                    'workers = ["cuda:0", "cuda:1"]\n')
    facts, grid_facts = kaggle_both(manifest={**kaggle_both()[0].manifest, "profile": "both-overlap"},
                                    bundle_profile="both-overlap")
    problems = both_failed(path, facts, grid_facts)
    assert list(problems) == ["GPU split"]
    assert problems["GPU split"] == f"{path}: reasoning.devices '0,1' and grid.devices '1,2' share GPU 1"
    two = both_failed(path, *kaggle_both(gpus=(L4, L4), manifest=facts.manifest, bundle_profile="both-overlap"))
    assert "grid.devices '1,2' names GPU 2, but 2 found" in two["GPU split"]
    assert "1 found (NVIDIA L4), the profile both-overlap-grid needs 2" in two["grid line: GPUs"]
    path.write_text('line = "both"\n[reasoning]\nprofile = "dense-27b-4xL4"\ndevices = "0,1"\n'
                    '[grid]\nprofile = "grid-4b-4xL4"\n')
    assert "grid.devices is empty (every GPU, shared with the other line)" in both_failed(path, facts, grid_facts)[
        "GPU split"]


def test_a_combined_bundle_refuses_a_missing_or_wrong_grid_model():
    facts, grid_facts = kaggle_both()
    missing = both_failed("both-4xL4", facts, replace(grid_facts, model_config=None, model_bytes=0))
    assert missing == {"grid line: model config": "grid-model/config.json is missing or not JSON"}
    swapped = both_failed("both-4xL4", facts, replace(grid_facts, model_config=facts.model_config))
    assert "the grid line needs 16 (build.models.grid_vocab)" in swapped["grid line: grid vocabulary"]


def test_the_command_on_a_combined_bundle_without_its_grid_model(tmp_path):
    """End to end on a CPU bundle of both-tiny: both models there passes; the grid model's folder gone is refused."""
    bundle = fake_bundle(tmp_path / "both", "both-tiny", CPU_LOCK, {"architectures": ["Qwen3ForCausalLM"]})
    (bundle / "grid-model").mkdir()
    (bundle / "grid-model" / "config.json").write_text(json.dumps(GRID_CONFIG))
    command = [sys.executable, "-m", "submission.kaggle.preflight", "--work", str(tmp_path / "work"), "--bundle",
               str(bundle)]
    passed = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert passed.returncode == 0 and "ok   grid line: grid vocabulary" in passed.stdout, passed.stdout
    assert "ok   reasoning line: model architecture" in passed.stdout
    (bundle / "grid-model" / "config.json").unlink()
    refused = subprocess.run(command, cwd=REPO, capture_output=True, text=True, timeout=120)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "FAIL grid line: model config: grid-model/config.json is missing or not JSON" in refused.stdout


def test_the_machine_stage_checks_the_gpus_and_driver_each_line_needs():
    """The machine stage (before the wheels): the GPU count and the driver, as the full preflight words them."""
    from submission.kaggle.preflight import both_machine_checks, machine_checks
    from submission.profiles import line_configs, load_both_profile

    machine = kaggle_moe().machine
    assert [(c.name, c.ok) for c in machine_checks(load_profile("moe-4xL4"), machine)] == [
        ("GPUs", True), ("NVIDIA driver", True)]
    refused = {c.name: c.detail for c in machine_checks(load_profile("moe-4xL4"), replace(machine, gpus=(L4,) * 2,
                                                                                           driver="535.104.05"))
               if not c.ok}
    assert refused == {"GPUs": "2 found (NVIDIA L4), the profile moe-4xL4 needs 4",
                       "NVIDIA driver": "535.104.05; the CUDA 13 wheels need 580 or newer"}
    grid = machine_checks(load_grid_profile("grid-4b-4xL4"), replace(machine, gpus=(L4,) * 3))
    assert [c.ok for c in grid] == [False, True] and "needs 4" in grid[0].detail
    assert [c.name for c in machine_checks(load_profile("cpu-tiny"), replace(machine, cuda=None, gpus=()))] == ["GPUs"]
    both = load_both_profile("both-4xL4")
    results = both_machine_checks(both, line_configs(both), "profiles/both-4xL4.toml", machine)
    assert [c.name for c in results if c.ok] == ["GPU split", "reasoning line: GPUs", "reasoning line: NVIDIA driver",
                                                 "grid line: GPUs", "grid line: NVIDIA driver"]
    two = both_machine_checks(both, line_configs(both), "profiles/both-4xL4.toml", replace(machine, gpus=(L4, L4)))
    assert [c.name for c in two if not c.ok] == ["GPU split", "grid line: GPUs"]


def fake_nvidia_smi(folder: Path, gpus: int, driver: str) -> Path:
    """A folder holding an `nvidia-smi` that answers preflight's query as a box with `gpus` L4s does (none: it fails
    as nvidia-smi does without a driver)."""
    folder.mkdir()
    rows = "".join(f"NVIDIA L4, 23034, {driver}\\n" for _ in range(gpus))
    script = (f"#!/bin/sh\nprintf '{rows}'\n" if gpus else
              "#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\"\n"
              "exit 9\n")
    (folder / "nvidia-smi").write_text(script)
    (folder / "nvidia-smi").chmod(0o755)
    return folder


@pytest.mark.parametrize("profile", ["moe-4xL4", "grid-4b-4xL4", "both-4xL4"])
def test_the_machine_stage_runs_on_a_bare_python_before_the_wheels(tmp_path, profile):
    """Issue 27: the GPU and driver checks run under Kaggle's Python before the wheel install. `python -S -E` has
    only the standard library (no site-packages: numpy, or any other package, cannot be imported), so the stage and
    the profile loaders it uses must import none; a fake nvidia-smi plays the machine."""
    python = [sys.executable, "-S", "-E"]
    no_numpy = subprocess.run(python + ["-c", "import numpy"], capture_output=True, text=True, timeout=60)
    assert no_numpy.returncode == 1 and "No module named 'numpy'" in no_numpy.stderr  # the premise
    bundle = fake_bundle(tmp_path / "bundle", profile, GPU_LOCK, {})
    command = python + ["-m", "submission.kaggle.preflight", "--bundle", str(bundle), "--stage", "machine"]

    def stage(gpus: int, driver: str) -> subprocess.CompletedProcess:
        path = fake_nvidia_smi(tmp_path / f"bin-{gpus}-{driver}", gpus, driver)
        return subprocess.run(command, cwd=REPO, env={"PATH": str(path)}, capture_output=True, text=True, timeout=60)

    ok = stage(4, "580.82.07")
    assert ok.returncode == 0 and ok.stdout.startswith("preflight: ok"), ok.stdout + ok.stderr
    assert "NVIDIA driver: 580.82.07; the CUDA 13 wheels need 580 or newer" in ok.stdout
    assert "model" not in ok.stdout and "disk" not in ok.stdout  # no bundle check: no wheels, no model yet
    none = stage(0, "")
    assert none.returncode == 1 and none.stdout.startswith("preflight: REFUSED"), none.stdout + none.stderr
    assert "GPUs: 0 found (none)" in none.stdout and "not found (no nvidia-smi)" in none.stdout
    old = stage(4, "535.104.05")
    assert old.returncode == 1 and "FAIL" in old.stdout and "NVIDIA driver: 535.104.05" in old.stdout, old.stdout
    assert [line.rsplit(": ", 1)[0] for line in old.stdout.splitlines() if "FAIL" in line] == [
        f"  FAIL {prefix}NVIDIA driver" for prefix in
        ({"both-4xL4": ["reasoning line: ", "grid line: "]}.get(profile, [""]))]
