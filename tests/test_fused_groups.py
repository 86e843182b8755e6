"""Contract tests against the locked vLLM 0.33 wheel's own source (read as a zip, never installed): the quantiser's
fused-group tables (build.quantize.fused) are the weights vLLM fuses into one linear for Qwen3, Qwen3-MoE, Qwen3-Next
and Qwen3.5 (its names as vLLM maps them), the recipes give the MTP layers what their loaders expect, and the rule on a
quantised output head beside MTP weights cites the vLLM line that decides it, per architecture. Then, on tiny
checkpoints, every fused group shares one global scale after quantisation and nothing else does. The wheel is fetched once per machine with
`pip download --no-deps vllm==0.33.0 -d ~/.cache/arc-kit/wheels/vllm-0.33.0`; without it the contract tests skip."""

from __future__ import annotations

import ast
import zipfile
from pathlib import Path

import pytest

from build.quantize.fused import HEAD_TARGETS, PACKED, UNQUANTISED_MTP_HEAD, fused_name, groups

WHEELS = Path.home() / ".cache" / "arc-kit" / "wheels" / "vllm-0.33.0"
MODELS = "vllm/model_executor/models/"


@pytest.fixture(scope="module")
def vllm_source():
    wheel = next(iter(sorted(WHEELS.glob("vllm-0.33.0-*.whl"))), None)
    if wheel is None:
        pytest.skip(f"no vLLM 0.33 wheel in {WHEELS} (pip download --no-deps vllm==0.33.0 -d {WHEELS})")
    archive = zipfile.ZipFile(wheel)
    return lambda path: archive.read(path).decode()


def class_node(source: str, name: str) -> ast.ClassDef:
    return next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == name)


def mapping_value(node: ast.expr, resolve) -> dict:
    """A mapping written as a literal or as `Base.packed_modules_mapping | {...}` (Qwen3.5's multimodal class);
    `resolve(class name)` gives another class's mapping."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr):
        return mapping_value(node.left, resolve) | mapping_value(node.right, resolve)
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return resolve(node.value.id)
    return ast.literal_eval(node)


def packed_mapping(source: str, cls: str, resolve=None) -> dict[str, tuple[str, ...]]:
    """The class attribute `packed_modules_mapping`, plus entries its __init__ adds (`self.packed_modules_mapping[k]
    = [...]`, Qwen3-MoE's conditional gate_up_proj)."""
    node = class_node(source, cls)
    out = {}
    for item in ast.walk(node):
        if isinstance(item, ast.Assign | ast.AnnAssign):  # annotated in Qwen3-VL
            target = item.targets[0] if isinstance(item, ast.Assign) else item.target
            if isinstance(target, ast.Name) and target.id == "packed_modules_mapping":
                out.update({k: tuple(v) for k, v in mapping_value(item.value, resolve).items()})
            elif (isinstance(target, ast.Subscript) and isinstance(target.value, ast.Attribute)
                  and target.value.attr == "packed_modules_mapping"):
                out[ast.literal_eval(target.slice)] = tuple(ast.literal_eval(item.value))
    return out


@pytest.mark.parametrize("arch, files", [
    ("qwen3", [("qwen3.py", "Qwen3ForCausalLM")]),
    ("qwen3_moe", [("qwen3_moe.py", "Qwen3MoeForCausalLM")]),
    ("qwen3_next", [("qwen3_next.py", "Qwen3NextForCausalLM"), ("qwen3_next_mtp.py", "Qwen3NextMTP")]),
])
def test_fused_tables_are_vllms(vllm_source, arch, files):
    for file, cls in files:
        mapping = packed_mapping(vllm_source(MODELS + file), cls)
        fused = {name: members for name, members in mapping.items() if len(members) > 1}
        assert fused == PACKED[arch], (file, cls)


def test_qwen3_5_table_is_vllms_with_its_names(vllm_source):
    """Qwen3.5 (the dense 27B's architecture): the text model's and the multimodal class's packed_modules_mapping are
    the table; the stacked renames of `Qwen3_5Model.hf_to_vllm_mapper` load each member into its fused linear, in the
    table's order; the multimodal class maps `model.language_model.` and drops `mtp.` (the drafter's), and the MTP
    drafter renames `mtp.` to its model and fuses only q/k/v and gate/up (its layer is full attention)."""
    source = vllm_source(MODELS + "qwen3_5.py")
    vl = vllm_source(MODELS + "qwen3_vl.py")
    resolve = lambda name: {k: list(v) for k, v in packed_mapping(vl, name).items()}  # noqa: E731
    table = PACKED["qwen3_5"]
    for cls in ("Qwen3_5ForCausalLMBase", "Qwen3_5ForConditionalGeneration"):
        fused = {k: v for k, v in packed_mapping(source, cls, resolve).items() if len(v) > 1}
        assert fused == table, cls
    model = ast.unparse(class_node(source, "Qwen3_5Model"))
    assert "'.in_proj_qkv': ('.in_proj_qkvz', (0, 1, 2))" in model and "'.in_proj_z': ('.in_proj_qkvz', 3)" in model
    assert "'.in_proj_b': ('.in_proj_ba', 0)" in model and "'.in_proj_a': ('.in_proj_ba', 1)" in model
    multimodal = ast.unparse(class_node(vl, "Qwen3VLForConditionalGeneration"))
    assert "'model.language_model.': 'language_model.model.'" in multimodal
    assert "WeightsMapper(orig_to_new_prefix={'mtp.': None})" in ast.unparse(
        class_node(source, "Qwen3_5ForConditionalGeneration"))
    mtp_source = vllm_source(MODELS + "qwen3_5_mtp.py")
    mtp = class_node(mtp_source, "Qwen3_5MTP")
    assert {k: v for k, v in packed_mapping(mtp_source, "Qwen3_5MTP").items() if len(v) > 1} == {
        k: table[k] for k in ("qkv_proj", "gate_up_proj")}
    assert "name = name.replace('mtp.', 'model.')" in ast.unparse(mtp)
    assert "layer_type='full_attention'" in ast.unparse(class_node(mtp_source, "Qwen3_5MultiTokenPredictor"))
    prefix = "model.language_model.layers.2.linear_attn."
    assert groups([prefix + leaf for leaf in ("in_proj_z", "in_proj_a", "in_proj_qkv", "in_proj_b", "out_proj")],
                  table) == {prefix + "in_proj_qkvz": [prefix + "in_proj_qkv", prefix + "in_proj_z"],
                             prefix + "in_proj_ba": [prefix + "in_proj_b", prefix + "in_proj_a"]}
    assert fused_name("mtp.layers.0.self_attn.k_proj", table) == "mtp.layers.0.self_attn.qkv_proj"


def test_the_mtp_head_rule_cites_the_line_that_builds_each_head(vllm_source):
    """Qwen3-Next's MTP builds its output head without the quantization config at the line UNQUANTISED_MTP_HEAD
    cites; Qwen3.5's builds it with the config (qwen3_5_mtp.py:238-243), so Qwen3.5 is not refused."""
    def heads(file: str, cls: str) -> list[ast.Call]:
        node = class_node(vllm_source(MODELS + file), cls)
        return [n for n in ast.walk(node) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "ParallelLMHead"]

    for arch, cited in UNQUANTISED_MTP_HEAD.items():
        file, _, lines = cited.partition(" ")[0].partition(":")
        first, last = map(int, lines.split("-"))
        (call,) = heads(file, "Qwen3NextMTP")
        assert (call.lineno, call.end_lineno) == (first, last), arch
        assert "quant_config" not in {k.arg for k in call.keywords}
    (call,) = heads("qwen3_5_mtp.py", "Qwen3_5MTP")
    assert (call.lineno, call.end_lineno) == (238, 243)
    assert ast.unparse(next(k.value for k in call.keywords if k.arg == "quant_config")) == "self.quant_config"
    assert "qwen3_5" not in UNQUANTISED_MTP_HEAD and "qwen3_next" in UNQUANTISED_MTP_HEAD
    fc = ast.unparse(class_node(vllm_source(MODELS + "qwen3_5_mtp.py"), "Qwen3_5MultiTokenPredictor"))
    assert "quant_config=fc_quant" in fc and "quant_config.get_name() == 'modelopt_fp4'" in fc


def test_the_head_targets_cite_the_lines_that_name_the_heads(vllm_source):
    """HEAD_TARGETS' citations: Qwen3.5's multimodal class builds its text model as `language_model`, whose head is
    `lm_head` under it, and the quantization config's mapper renames only targets with a dot."""
    def lines(path: str, first: int, last: int) -> str:
        return "\n".join(vllm_source(path).splitlines()[first - 1:last])

    assert 'prefix=maybe_prefix(prefix, "language_model")' in lines(MODELS + "qwen3_5.py", 522, 525)
    assert 'prefix=maybe_prefix(prefix, "lm_head")' in lines(MODELS + "qwen3_5.py", 347, 352)
    assert 'is_layer_path = "." in target' in lines(
        "vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors.py", 142, 146)
    assert HEAD_TARGETS == {"qwen3_5": ("lm_head", "language_model.lm_head")}


def test_routed_experts_fuse_gate_and_up(vllm_source):
    """Each routed expert's gate_proj and up_proj load into one w13 (RoutedExperts' defaults and its mapping), which
    the `gate_up_proj` entry of every table covers (`experts.E.gate_proj` -> `experts.E.gate_up_proj`)."""
    source = vllm_source("vllm/model_executor/layers/fused_moe/routed_experts.py")
    init = next(n for n in ast.walk(class_node(source, "RoutedExperts"))
                if isinstance(n, ast.FunctionDef) and n.name == "__init__")
    positional = init.args.args[len(init.args.args) - len(init.args.defaults):]
    defaults = dict(zip([a.arg for a in positional], init.args.defaults))
    assert ast.literal_eval(defaults["ckpt_gate_proj_name"]) == "gate_proj"
    assert ast.literal_eval(defaults["ckpt_up_proj_name"]) == "up_proj"
    assert "w13 if weight_name in [ckpt_gate_proj_name, ckpt_up_proj_name] else w2" in source
    for table in PACKED.values():
        assert fused_name("model.layers.3.mlp.experts.7.up_proj", table) == "model.layers.3.mlp.experts.7.gate_up_proj"
        assert fused_name("model.layers.3.mlp.experts.7.down_proj", table) is None


def test_shared_experts_fuse_gate_and_up(vllm_source):
    source = vllm_source(MODELS + "qwen3_next.py")
    assert '".shared_expert.gate_proj": (".shared_expert.gate_up_proj", 0)' in source
    assert '".shared_expert.up_proj": (".shared_expert.gate_up_proj", 1)' in source
    table = PACKED["qwen3_next"]
    assert groups(["mtp.layers.0.mlp.shared_expert.up_proj", "mtp.layers.0.mlp.shared_expert.gate_proj",
                   "mtp.layers.0.mlp.shared_expert.down_proj"], table) == {
        "mtp.layers.0.mlp.shared_expert.gate_up_proj": ["mtp.layers.0.mlp.shared_expert.gate_proj",
                                                        "mtp.layers.0.mlp.shared_expert.up_proj"]}


def test_mtp_loader_expectations(vllm_source):
    """What vLLM 0.33's Qwen3-Next MTP expects of a quantised checkpoint, read from its source: the MTP decoder layer
    and `mtp.fc` are built with the checkpoint's quantization config under their checkpoint names (`mtp.` prefix),
    routed experts take the scheme of expert 0's names, and the MTP output head is built with no quantization config
    (so `lm_head` must stay unquantised: the quantiser refuses otherwise, tests/test_build_scale.py)."""
    source = vllm_source(MODELS + "qwen3_next_mtp.py")
    mtp = class_node(source, "Qwen3NextMTP")
    heads = [n for n in ast.walk(mtp) if isinstance(n, ast.Call) and getattr(n.func, "id", "") == "ParallelLMHead"]
    assert heads and all("quant_config" not in {k.arg for k in h.keywords} for h in heads)
    assert "maybe_prefix(prefix, 'mtp')" in ast.unparse(mtp)
    predictor = ast.unparse(class_node(source, "Qwen3NextMultiTokenPredictor"))
    assert "quant_config=fc_quant" in predictor and "prefix=f'{prefix}.fc'" in predictor
    assert "layer_type='full_attention'" in predictor and "prefix=f'{prefix}.layers.{idx}'" in predictor
    moe = vllm_source("vllm/model_executor/layers/quantization/compressed_tensors/compressed_tensors_moe/"
                      "compressed_tensors_moe.py")
    assert 'f"{layer_name}.0.{proj_name}"' in moe


def test_each_fused_group_shares_one_global_scale(tmp_path, request):
    """Qwen3 (dense gate/up, q/k/v) and Qwen3-Next (also shared experts and routed experts) under an all-NVFP4
    recipe: members of a group carry one global scale, and groups differ from each other."""
    pytest.importorskip("compressed_tensors.entrypoints.convert.converters.magnitude_expert_pruner",
                        reason="needs the build environment (make build-env)")
    read_tensors = request.getfixturevalue("read_tensors")  # after the skip: the fixture needs safetensors
    from build.models.tiny import make_checkpoint
    from build.quantize.quantizer import quantize

    recipe = tmp_path / "all.toml"
    recipe.write_text('[[rules]]\npattern = \'_proj$\'\nscheme = "NVFP4A16"\n')
    for arch in ("qwen3", "qwen3_next"):
        quantize(make_checkpoint(tmp_path / arch, arch, seed=0), recipe, tmp_path / f"{arch}-q")
        after = read_tensors(tmp_path / f"{arch}-q")
        scales = {n[:-len(".weight_global_scale")]: t for n, t in after.items() if n.endswith(".weight_global_scale")}
        found = groups(list(scales), PACKED[arch])
        kinds = {name.rpartition(".")[2] + (" (expert)" if ".experts." in name else "") for name in found}
        expected = {"qkv_proj", "gate_up_proj"} | ({"gate_up_proj (expert)"} if arch == "qwen3_next" else set())
        assert kinds == expected
        if arch == "qwen3_next":
            assert any(".shared_expert." in name for name in found)
        for members in found.values():
            assert all(scales[m].item() == scales[members[0]].item() for m in members), members
        assert len({scales[members[0]].item() for members in found.values()}) > 1
        down = [m for m in scales if m.endswith("down_proj")]
        assert all(fused_name(m, PACKED[arch]) is None for m in down)
