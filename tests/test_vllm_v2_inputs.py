"""The V2 answer-temperature processor on inputs built as vLLM 0.33's Model Runner V2 builds them (issue 31).

What fails only on a GPU is what V2's own buffers do, not what a hand-made batch does: the request state is 0.33's
`RequestState` (vllm/v1/worker/gpu/states.py), executed from the locked wheel on CPU (tests/test_vllm_v2.py fetches
the wheel the same way); each step's rows are laid out as `prepare_inputs` (vllm/v1/worker/gpu/model_runner.py),
`expand_idx_mapping` (vllm/v1/worker/gpu/input_batch.py) and the rejection sampler's `gather_draft_sampled` and
`_verify_in_chunks` (vllm/v1/worker/gpu/spec_decode/rejection_sampler.py) lay them out. The expected logits come from
each request's token stream (prompt, committed output, this step's drafts), not from the processor's rules. Two CPU
checks stand in for the GPU's: the per-step path on the meta device (tensors without data, so anything that reads a
value on the host fails) under a TorchDispatchMode that also flags the synchronising ops, and the same path's
dispatched op count at 8 and 64 requests. Four kinds of broken processor (the host sync in two forms) show that these
tests catch what the older ones did not (issue 31, section 2).
"""

from __future__ import annotations

import ast
import inspect
import random
import sys
import textwrap
import types
from collections.abc import Iterator
from contextlib import nullcontext
from dataclasses import dataclass, field
from types import SimpleNamespace
from unittest import mock

import numpy as np
import pytest

from offline_wheels.source import Source

torch = pytest.importorskip("torch", reason="needs the engine environment (make engine-env)")
pytest.importorskip("vllm.v1.worker.gpu.sample.logits_processor.interface", reason="needs vLLM's V2 interface")

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402
from vllm import SamplingParams  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext, LogitsProcRequestState  # noqa: E402

from submission.reasoning.reply_grammar import CHAT_TOKENS  # noqa: E402
from submission.reasoning.engines.vllm_logits_v2 import MAX_BANNED, AnswerTemperature  # noqa: E402

BUFFERS = "vllm/v1/worker/gpu/buffer_utils.py"
STATES = "vllm/v1/worker/gpu/states.py"
INPUT_BATCH = "vllm/v1/worker/gpu/input_batch.py"
RUNNER = "vllm/v1/worker/gpu/model_runner.py"
REJECTION = "vllm/v1/worker/gpu/spec_decode/rejection_sampler.py"
# A prime vocabulary: no other dimension of a step equals it, so a [rows, vocab] temporary is recognisable.
THINK, BANNED, VOCAB = 7, [3, 5, 11, 13], 101


def _apply_write_on_cpu(self) -> None:
    """StagedWriteTensor.apply_write without its Triton kernel (`_apply_write_kernel`, GPU only): staged write i
    copies contents[cu_lens[i-1]:cu_lens[i]] into row indices[i] from column starts[i]."""
    rows = self.gpu.view(self.num_rows, -1)
    begin = 0
    for index, start, end in zip(self._staged_write_indices, self._staged_write_starts, self._staged_write_cu_lens):
        contents = self._staged_write_contents[begin:end]
        rows[index, start:start + len(contents)] = torch.tensor(contents, dtype=self.dtype)
        begin = end
    self.clear_staged_writes()


@pytest.fixture(scope="module")
def v2(v033):
    """0.33's states.py and buffer_utils.py executed from the wheel, and its request chunker: the UVA pools take
    0.33's own fallback for platforms without pinned memory (`NonUvaBuffer`), which re-points `UvaBackedTensor.gpu`
    at every flush exactly as the UVA path does; only the Triton write kernel is replaced."""
    buffers = types.ModuleType("vllm033_buffer_utils")
    exec(compile(v033.read(BUFFERS), f"{v033.where.name}/{BUFFERS}", "exec"), buffers.__dict__)
    buffers.is_uva_available = lambda: False
    buffers.StagedWriteTensor.apply_write = _apply_write_on_cpu
    states = types.ModuleType("vllm033_states")
    with mock.patch.dict(sys.modules, {"vllm.v1.worker.gpu.buffer_utils": buffers}):
        exec(compile(v033.read(STATES), f"{v033.where.name}/{STATES}", "exec"), states.__dict__)
    chunker = next(node for node in ast.parse(v033.read(REJECTION)).body
                   if isinstance(node, ast.FunctionDef) and node.name == "_iter_request_chunks")
    namespace = {"np": np, "Iterator": Iterator}
    exec(compile(ast.Module([chunker], type_ignores=[]), f"{v033.where.name}/{REJECTION}", "exec"), namespace)
    return SimpleNamespace(RequestState=states.RequestState, iter_request_chunks=namespace["_iter_request_chunks"])


def test_the_layout_these_tests_build_is_033s(v033):
    """Each GPU-only fact the step builder below relies on, in the 0.33 file that decides it."""
    states, buffers, batch = v033.read(STATES), v033.read(BUFFERS), v033.read(INPUT_BATCH)
    runner, rejection = v033.read(RUNNER), v033.read(REJECTION)
    assert "self.prompt_len = UvaBackedTensor(self.max_num_reqs, dtype=torch.int32)" in states
    assert "self.prompt_len.copy_to_uva()" in states  # every flush, staged or not
    assert "self.prefill_len.np[req_idx] = prefill_len" in states  # on the host, at add_request
    assert "self.np = self.cpu.numpy()" in buffers  # ... in the host array the UvaBackedTensor keeps
    assert runner.index("self.req_states.add_request(") < runner.index("self.sampler.add_request(req_index")
    assert "self.gpu = self.pool.copy_to_uva(" in buffers  # ... re-points .gpu to the pool's next buffer
    assert "self.input_ids = torch.zeros(max_num_tokens, dtype=torch.int32" in batch
    assert "self.positions = torch.zeros(max_num_tokens, dtype=torch.int64" in batch
    assert "total_num_logits, dtype=torch.int32, device=idx_mapping.device" in batch  # expanded_local_pos
    assert "idx_mapping_np, device=self.device, dtype=torch.int64" in runner  # idx_mapping
    assert "expanded_local_pos = torch.zeros(\n                num_reqs, dtype=torch.int32" in runner  # no drafts
    assert "is_placeholder = (local_pos > 0) & (pos - local_pos < prefill_len)" in rejection
    assert "token_id = tl.where(is_placeholder, -1, token_id)" in rejection
    assert "input_batch.expanded_local_pos[lo:hi]" in rejection  # apply runs once per chunk of whole requests


def params(scale: float | None) -> SamplingParams:
    if scale is None:
        return SamplingParams(extra_args={"unrelated": 1})
    return SamplingParams(extra_args={"answer_scale": scale, "think_end_id": THINK, "banned_ids": BANNED})


@dataclass
class Request:
    slot: int
    prompt_len: int
    scale: float | None
    stream: list[int]  # committed tokens: the prompt, then output (all of it at once for a resumed request)
    computed: int = 0  # prefill tokens computed so far


@dataclass
class Row:
    req_id: str
    slot: int
    local: int  # its offset among its request's rows
    pos: int
    fed: int  # the token fed at pos: -1 on a placeholder draft row


@dataclass
class Step:
    rows: list[Row] = field(default_factory=list)
    held: dict[str, list[int]] = field(default_factory=dict)  # each request's committed tokens before the step
    logits: torch.Tensor | None = None  # what the model gave
    result: torch.Tensor | None = None  # after the processor, chunk by chunk


class Runner:
    """A Model Runner V2 step loop on CPU around 0.33's RequestState: add and remove requests, flush the staged
    writes, lay out one step's rows (batch order as given, placeholder and draft rows), run the processor chunk by
    chunk as the rejection sampler does, commit the accepted tokens as `post_update` does."""

    def __init__(self, v2, processor_class, drafts: int, slots: int = 8, max_len: int = 96, device: str = "cpu"):
        self.v2, self.drafts, self.device = v2, drafts, torch.device(device)
        self.state = v2.RequestState(max_num_reqs=slots, max_model_len=max_len, max_num_batched_tokens=max_len,
                                     num_speculative_steps=drafts, vocab_size=VOCAB, device=self.device)
        config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=drafts) if drafts else None)
        self.processor = processor_class(config, LogitsProcRequestState.from_request_state(self.state))
        self.requests: dict[str, Request] = {}

    def add(self, req_id: str, prompt: list[int], scale: float | None, output: tuple[int, ...] = ()) -> None:
        """A new request, or one resumed after preemption (it arrives with its output)."""
        tokens = list(prompt) + list(output)
        self.state.add_request(req_id, len(prompt), tokens, num_computed_tokens=0, max_tokens=32)
        slot = self.state.req_id_to_index[req_id]
        self.processor.add_request(slot, params(scale))
        self.requests[req_id] = Request(slot, len(prompt), scale, tokens)

    def remove(self, req_id: str) -> None:
        self.state.remove_request(req_id)
        del self.requests[req_id]

    def step(self, schedule: dict[str, tuple], max_chunk_logits: int = 4, seed: int = 0, hook=None) -> Step:
        """schedule, in batch order: req_id -> (prefill tokens this step, or 0 for a decode; this step's drafts (a
        prefill's count as placeholders); drafts accepted; the token sampled after them). `hook(run)` wraps the
        processor's calls (a dispatch mode)."""
        self.state.apply_staged_writes()  # the runner flushes req_states first, then the processors (interface.py)
        step = Step(held={r: list(self.requests[r].stream) for r in schedule})
        with hook() if hook else nullcontext():
            self.processor.apply_staged_writes()
        ids, positions, logits_indices, num_logits = [], [], [], []
        for req_id, (chunk, drafts, _, _) in schedule.items():
            req = self.requests[req_id]
            if chunk:  # prefill: this chunk of the stream, then placeholder draft slots (a padded first step)
                query = req.stream[req.computed:req.computed + chunk] + [0] * len(drafts)
                first = req.computed
            else:  # decode: the last sampled token, then the drafts
                query = req.stream[-1:] + list(drafts)
                first = len(req.stream) - 1
            start = len(ids)
            ids += query
            positions += range(first, first + len(query))
            rows = 1 + len(drafts)
            logits_indices += range(start + len(query) - rows, start + len(query))
            prefill_len = int(self.state.prefill_len.gpu[req.slot])
            for local in range(rows):
                offset = len(query) - rows + local
                placeholder = local > 0 and first + offset - local < prefill_len  # gather_draft_sampled's rule
                step.rows.append(Row(req_id, req.slot, local, first + offset, -1 if placeholder else query[offset]))
            num_logits.append(rows)
        slots = np.array([self.requests[r].slot for r in schedule], dtype=np.intp)
        index = torch.tensor(logits_indices)
        input_ids = torch.tensor(ids, dtype=torch.int32)[index]
        fed = torch.tensor([row.fed for row in step.rows], dtype=torch.int32)
        assert torch.equal(torch.where(fed < 0, fed, input_ids), fed)  # the builder agrees with its own rows
        cu = np.concatenate([[0], np.cumsum(num_logits)]).astype(np.int32)
        idx_mapping = torch.tensor(slots, dtype=torch.int64)
        step.logits = torch.randn(len(step.rows), VOCAB, generator=torch.Generator().manual_seed(seed))
        step.logits[:, 17] = -torch.inf  # a grammar-masked token stays masked
        context = dict(
            idx_mapping=idx_mapping, idx_mapping_np=slots,
            expanded_idx_mapping=torch.repeat_interleave(idx_mapping, torch.tensor(num_logits)),
            expanded_local_pos=torch.tensor([row.local for row in step.rows], dtype=torch.int32),
            input_ids=fed, pos=torch.tensor(positions, dtype=torch.int64)[index],
            seq_lens_upper_bound_np=np.array([self._seq_len(r, s) for r, s in schedule.items()], dtype=np.int32))
        chunks = self.v2.iter_request_chunks(cu, max_chunk_logits) if self.drafts else [(0, len(slots))]
        results = []
        for start, end in chunks:
            lo, hi = int(cu[start]), int(cu[end])
            ctx = LogitsContext(**{k: _on(v[start:end] if k in PER_REQUEST else v[lo:hi], self.device)
                                   for k, v in context.items()})
            chunk_logits = step.logits[lo:hi].clone().to(self.device)  # apply_sampling_params' fresh FP32 copy
            with hook() if hook else nullcontext():
                results.append(self.processor.apply(chunk_logits, ctx))
        step.result = torch.cat(results) if self.device.type != "meta" else None
        self._commit(schedule)
        return step

    def _seq_len(self, req_id: str, spec: tuple) -> int:
        req, (chunk, drafts, _, _) = self.requests[req_id], spec
        return (req.computed + chunk if chunk else len(req.stream)) + len(drafts)

    def _commit(self, schedule: dict[str, tuple]) -> None:
        """post_update: a finished prefill or a decode appends its accepted drafts and the sampled token to
        all_token_ids at total_len and moves total_len; a chunk inside the prefill appends nothing."""
        for req_id, (chunk, drafts, accepted, sampled) in schedule.items():
            req = self.requests[req_id]
            if chunk:
                req.computed += chunk
                if req.computed < len(req.stream):
                    continue
                new = [sampled]
            else:
                new = list(drafts[:accepted]) + [sampled]
            total = len(req.stream)
            self.state.all_token_ids.gpu[req.slot, total:total + len(new)] = torch.tensor(new, dtype=torch.int32)
            self.state.total_len.gpu[req.slot] = total + len(new)
            req.stream += new


PER_REQUEST = ("idx_mapping", "idx_mapping_np", "seq_lens_upper_bound_np")  # the rest has one entry per row


def _on(value, device):
    return value.to(device) if isinstance(value, torch.Tensor) else value


def expected(runner: Runner, step: Step) -> torch.Tensor:
    """From the token streams alone: a row predicts the token after its position, so it is past `</think>` when a
    `</think>` sits at a position after the prompt and up to the row's own, among the tokens the engine holds for
    that request (committed ones, then this step's fed tokens: drafts, or nothing on a placeholder). Such a row of a
    request that set answer_scale is divided by it and loses the banned ids; every other row is left alone. (Rows
    whose sample vLLM discards, a chunk inside a prefill or a placeholder, are held to the same rule.)"""
    want = step.logits.clone()
    for i, row in enumerate(step.rows):
        req = runner.requests[row.req_id]
        committed = step.held[row.req_id]
        held = committed + [r.fed for r in step.rows if r.req_id == row.req_id and r.pos >= len(committed)]
        seen = held[req.prompt_len:row.pos + 1]
        if req.scale is not None and THINK in seen:
            want[i] = step.logits[i] / req.scale
            want[i, BANNED] = -torch.inf
    return want


def run_streams(v2, processor_class) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Four steps with two drafts per request: chunked and resumed prefills, placeholder and draft rows, a rejected
    and an accepted draft `</think>`, a recycled slot, batch order shuffled, the rejection sampler's chunks of at
    most 4 rows. Returns (result, expected) per step."""
    runner = Runner(v2, processor_class, drafts=2)
    out = []

    def run(schedule, adds=(), removes=(), seed=0):
        for req_id in removes:
            runner.remove(req_id)
        for req_id, prompt, scale, *output in adds:
            runner.add(req_id, prompt, scale, *output)
        order = list(schedule)
        random.Random(seed).shuffle(order)
        step = runner.step({r: schedule[r] for r in order}, seed=seed)
        out.append((step.result, expected(runner, step)))

    long_output = tuple([8] * 30 + [THINK] + [9] * 5)  # beyond one step's scan window (8 x (2 + 1) tokens)
    run({"a": (3, [0, 0], 0, 8),  # prompt ending in </think> (an earlier turn), then two placeholder rows: no row
         "b": (6, [], 0, 0),  # first chunk of a 10-token prompt holding </think>: fed at a prompt position, no row
         "c": (3, [0, 0], 0, 9),  # a request the processor leaves alone (its placeholders match its </think> id, -1)
         "d": (39, [], 0, 9)},  # resumed after preemption, </think> far back in its output: its row
        adds=[("a", [1, 2, THINK], 0.5), ("b", [1, 2, 4, 6, 8, THINK, 9, 10, 12, 14], 0.25),
              ("c", [1, 2, 4], None), ("d", [1, 2, 4], 0.5, long_output)], seed=1)
    run({"a": (0, [10, THINK], 2, 12),  # </think> in the second draft: its row only; accepted
         "b": (4, [], 0, THINK),  # the prefill's last chunk; </think> is sampled
         "c": (0, [THINK, 5], 0, 5),
         "d": (0, [1, 2], 1, 3),
         "e": (4, [], 0, 6)},
        adds=[("e", [1, 2, 4, 5], 0.5)], seed=2)
    run({"b": (0, [3, 5], 2, 6),  # </think> committed last step, fed at row 0: every row
         "c": (0, [8, 9], 1, 9),
         "d": (0, [1, 2], 0, 3),
         "e": (0, [THINK, 8], 0, 9),  # a draft </think>, rejected
         "f": (6, [], 0, 8)},  # a's recycled slot: a prompt of another length, none of a's </think>
        adds=[("f", [1, THINK, 2, 4, 6, 10], 0.25)], removes=["a"], seed=3)
    run({"b": (0, [1, 2], 0, 3), "c": (0, [1, 2], 0, 3), "d": (0, [1, 2], 0, 3),
         "e": (0, [1, 2], 0, 3),  # the rejected </think> holds no row
         "f": (0, [8, 9], 0, 10)}, seed=4)
    return out


def stream_mismatch(v2, processor_class) -> str | None:
    try:
        steps = run_streams(v2, processor_class)
    except Exception as err:  # noqa: BLE001 - a processor that cannot take 0.33's inputs fails here
        return f"raised {type(err).__name__}: {err}"
    bad = [i for i, (got, want) in enumerate(steps) if not torch.equal(got, want)]
    return f"steps {bad} differ from the token streams" if bad else None


# --- the per-step path on the meta device: no host sync, no per-request work, nothing vocabulary-wide ------------

SYNCING = {"aten._local_scalar_dense", "aten.item", "aten.is_nonzero", "aten.nonzero", "aten.masked_select",
           "aten.unique_dim", "aten._unique2", "aten.unique_consecutive", "aten.equal", "aten.allclose"}
MAX_LEN = 96  # max_model_len of these steps: a [requests, max_model_len] temporary is recognisable too


class PerStepOps(TorchDispatchMode):
    """Every aten op the processor dispatches: its name, whether it waits for the device (a value read on the host,
    a device-to-host copy, a data-dependent shape), and any new tensor as wide as the vocabulary or max_model_len."""

    def __init__(self):
        super().__init__()
        self.ops: list[str] = []
        self.syncs: list[str] = []
        self.wide: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = str(func.overloadpacket)
        self.ops.append(name)
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        if name in SYNCING or (name in ("aten.index", "aten.index_put_") and any(
                isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in _flat(args[1:2]))):  # a mask index
            self.syncs.append(name)
        out = func(*args, **(kwargs or {}))
        if any(isinstance(o, torch.Tensor) and o.device.type == "cpu" for o in _flat([out])) and any(
                t.device.type == "meta" for t in tensors):
            self.syncs.append(f"{name} to the host")
        in_place_or_view = func._schema.arguments and func._schema.arguments[0].alias_info is not None
        if not in_place_or_view and any(isinstance(o, torch.Tensor) and {VOCAB, MAX_LEN} & set(o.shape)
                                        for o in _flat([out])):
            self.wide.append(name)
        return out


def _flat(values) -> list:
    flat = []
    for value in values:
        flat += _flat(value) if isinstance(value, (list, tuple)) else [value]
    return flat


def two_steps(v2, processor_class, requests: int, first=None, steady=None) -> None:
    """`requests` requests on the meta device with two drafts each: the step that admits them (one in four resumed
    after preemption, with output), then a steady decode step; `first` and `steady` wrap the processor's calls."""
    runner = Runner(v2, processor_class, drafts=2, slots=64, max_len=MAX_LEN, device="meta")
    names = [f"r{i}" for i in range(requests)]
    for i, name in enumerate(names):
        runner.add(name, [1, 2, 4], 0.5 if i % 4 else None, (8, THINK, 9) if i % 4 == 1 else ())
    runner.step({name: (len(runner.requests[name].stream), [], 0, 8) for name in names}, 10**6, hook=first)
    runner.step({name: (0, [THINK, 9], 1, 8) for name in names}, 10**6, hook=steady)


def per_step_ops(v2, processor_class, requests: int, step: str) -> PerStepOps:
    """The processor's dispatched ops in the `step` ("first" or "steady"); a host read on meta (`.tolist()`,
    `.cpu()`, `.item()`) raises."""
    mode = PerStepOps()
    try:
        two_steps(v2, processor_class, requests, **{step: lambda: mode})
    except (NotImplementedError, RuntimeError) as err:
        mode.syncs.append(f"a value read on the host: {err}")
    return mode


STEPS = ("first", "steady")


def host_syncs(v2, processor_class) -> str | None:
    syncs = [f"{step}: {sync}" for step in STEPS for sync in per_step_ops(v2, processor_class, 8, step).syncs]
    return f"synchronises: {syncs}" if syncs else None


def per_request_ops(v2, processor_class) -> str | None:
    counts = {step: [len(per_step_ops(v2, processor_class, n, step).ops) for n in (8, 64)] for step in STEPS}
    grows = {step: c for step, c in counts.items() if c[0] != c[1]}
    return f"ops at 8 and 64 requests: {grows}" if grows else None


# --- the shipped processor ------------------------------------------------------------------------------------


def test_apply_follows_the_token_streams(v2):
    assert stream_mismatch(v2, AnswerTemperature) is None


def test_the_per_step_path_never_waits_for_the_device(v2):
    assert host_syncs(v2, AnswerTemperature) is None


def test_the_per_step_op_count_does_not_grow_with_the_batch(v2):
    assert per_request_ops(v2, AnswerTemperature) is None


@pytest.mark.parametrize("step", STEPS)
def test_apply_allocates_nothing_vocabulary_or_context_wide(v2, step):
    """vLLM profiles memory with requests that carry no extra_args, so apply's temporaries are never profiled: only
    the logits themselves (in place) may be vocabulary-wide, and nothing max_model_len-wide (a first step used to
    scan each new request's whole row of all_token_ids)."""
    mode = per_step_ops(v2, AnswerTemperature, 64, step)
    assert mode.ops and not mode.wide, mode.wide


def test_the_kit_bans_no_more_ids_than_the_processor_holds():
    assert len(CHAT_TOKENS) <= MAX_BANNED
    AnswerTemperature.validate_params(params(0.5))
    with pytest.raises(ValueError, match="at most 4"):
        AnswerTemperature.validate_params(SamplingParams(extra_args={
            "answer_scale": 0.5, "think_end_id": THINK, "banned_ids": [1, 2, 3, 4, 5]}))


# --- four broken processors, each caught -----------------------------------------------------------------------


class CachesPromptLen(AnswerTemperature):
    """Keeps the prompt_len buffer it was built with: V2 re-points `prompt_len.gpu` at every flush."""

    def __init__(self, vllm_config, req_states):
        super().__init__(vllm_config, req_states)
        prompt_len = SimpleNamespace(gpu=req_states.prompt_len.gpu, np=req_states.prompt_len.np)
        self.req_states = SimpleNamespace(**{k: getattr(req_states, k) for k in (
            "device", "max_num_reqs", "vocab_size", "all_token_ids", "prefill_len", "total_len")},
            prompt_len=prompt_len)


def _patched(old: str, new: str) -> type:
    """AnswerTemperature with one line of its source changed."""
    source = textwrap.dedent(inspect.getsource(AnswerTemperature))
    assert old in source, old
    module = inspect.getmodule(AnswerTemperature)
    namespace = dict(vars(module))
    exec(compile(source.replace(old, new), module.__file__, "exec"), namespace)
    return namespace["AnswerTemperature"]


class LoopsOverRequests(AnswerTemperature):
    """Scans each request's new tokens in a Python loop: right, but its op count grows with the batch."""

    def _scan_new(self, reqs):
        for i in range(reqs.shape[0]):
            super()._scan_new(reqs[i:i + 1])


class SkipsIdleSteps(AnswerTemperature):
    """Returns early when no row needs the processor, asking the device: a host sync every step."""

    def apply(self, logits, ctx):
        if not bool((self.seen[ctx.expanded_idx_mapping.long()] | (ctx.input_ids.long() == THINK)).any()):
            return logits
        return super().apply(logits, ctx)


class ReadsSlotsOnTheHost(AnswerTemperature):
    """Reads the row-to-slot map back to the host to pick its rows: a device-to-host copy every step."""

    def apply(self, logits, ctx):
        self.active[ctx.expanded_idx_mapping.tolist()]
        return super().apply(logits, ctx)


@pytest.mark.parametrize("broken, check", [
    (CachesPromptLen, stream_mismatch),
    ("drops .long()", stream_mismatch),
    (LoopsOverRequests, per_request_ops),
    (SkipsIdleSteps, host_syncs),
    (ReadsSlotsOnTheHost, host_syncs),
], ids=["caches prompt_len.gpu", "int32 local positions", "per-request loop", "bool() sync", "tolist() sync"])
def test_a_broken_processor_is_caught(v2, broken, check):
    if broken == "drops .long()":
        broken = _patched("local = ctx.expanded_local_pos.long()", "local = ctx.expanded_local_pos")
    assert check(v2, broken) is not None
