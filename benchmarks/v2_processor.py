"""Per-step cost of the V2 answer-temperature processor at the moe-4xL4 shape (issues 31 and 43), on CPU tensors.

    python benchmarks/v2_processor.py [--before b26e23e]   # the engine environment (make engine-env)

The shape: the profile's `max_num_seqs` requests (64), each with 1 + `mtp_speculative_tokens` logits rows (5): 320
rows of the vocabulary of moe-4xL4's model, the pruned Qwen3-Next-80B-A3B (pruning keeps the vocabulary:
build.models.topology, 151,936 tokens). Rows laid out as vLLM 0.33's Model Runner V2 lays them out (int32 input ids and
local positions, slots in a shuffled batch order; tests/test_vllm_v2_inputs.py). Two batches: every request still
thinking (most of a run), and half of them past `</think>`. One steady step is measured, after the step that admits
them.

Bytes are counted per dispatched aten op (a TorchDispatchMode): a new tensor's bytes, the whole tensor for an
in-place elementwise op, the indexed elements for a scatter or an indexed write, nothing for a view; and, for the
processor's Triton kernel (reasoning/engines/vllm_logits_v2.write_rows, run here by Triton's interpreter), the
elements its masked stores and loads touch, counted in the interpreter's store and load (the interpreter's own
copies of its arguments to and from the host, which a GPU launch does not make, are not counted). "Logits" counts only
what lands in (or is read from) the logits tensor. "Before" is the processor at --before (issue 43's starting point,
read with `git show`), "after" the working tree's.

Targets: after, 0 bytes of logits written and read while every row thinks, and at most the answer rows' (rows x
vocabulary x 4 bytes) with half past `</think>`; before / after >= 1.9 bytes written with half past (expected 2: the
whole logits divided, against half of it); the same dispatched op count at 8 and at 64 requests.
"""

from __future__ import annotations

import argparse
import math
import random
import subprocess
import sys
import types
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from vllm import SamplingParams  # noqa: E402
from vllm.v1.worker.gpu.sample.logits_processor.interface import LogitsContext  # noqa: E402

from build.models.topology import TOPOLOGIES  # noqa: E402
from submission.reasoning.engines import vllm_logits_v2  # noqa: E402
from submission.profiles import load_profile  # noqa: E402
from targets import Targets  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MODULE = "submission/reasoning/engines/vllm_logits_v2.py"
FORMER = "submission/engines/vllm_logits_v2.py"  # its place before issue 46 (the default --before's)
THINK, BANNED = 151668, [151644, 151645, 151667, 151668]  # Qwen3's </think>, and four chat tokens
MAX_LEN = 8192  # committed tokens per slot: a steady step reads only its scan window of them


def written(func, args, out) -> int:
    """Bytes one aten op writes (see the module docstring)."""
    schema = func._schema
    name = str(func.overloadpacket)
    first = schema.arguments[0].alias_info if schema.arguments else None
    if first is not None and first.is_write:  # in place on its first argument
        target = args[0]
        if name in ("aten.scatter_", "aten.scatter_reduce_"):
            return args[2].numel() * target.element_size()
        if name == "aten.index_put_":
            indexed = torch.broadcast_shapes(*(i.shape for i in args[1] if i is not None))
            rest = target.shape[len(args[1]):]
            return math.prod(indexed) * math.prod(rest) * target.element_size()
        return target.numel() * target.element_size()
    if first is not None or any(r.alias_info is not None for r in schema.returns):  # a view
        return 0
    outs = out if isinstance(out, (tuple, list)) else [out]
    return sum(o.numel() * o.element_size() for o in outs if isinstance(o, torch.Tensor))


class Counter(TorchDispatchMode):
    """Bytes written by aten ops and by the kernel's stores, and what of them touched the logits. `paused` while the
    kernel runs: the interpreter's own host copies are not the kernel's work."""

    def __init__(self, logits: torch.Tensor):
        super().__init__()
        self.storage = logits.untyped_storage()
        self.start, self.end = logits.data_ptr(), logits.data_ptr() + logits.numel() * logits.element_size()
        self.ops = self.bytes = self.logits_written = self.logits_read = 0
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if not self.paused:
            self.ops += 1
            count = written(func, args, out)
            self.bytes += count
            target = args[0] if args and isinstance(args[0], torch.Tensor) else None
            if count and target is not None and target.untyped_storage().data_ptr() == self.storage.data_ptr():
                self.logits_written += count
        return out

    def kernel_access(self, pointers: np.ndarray, mask: np.ndarray, itemsize: int, store: bool) -> None:
        touched = pointers[mask]
        inside = int(((touched >= self.start) & (touched < self.end)).sum()) * itemsize
        if store:
            self.bytes += touched.size * itemsize
            self.logits_written += inside
        else:
            self.logits_read += inside


def counting_kernel(counter: Counter):
    """write_rows with the counter paused and the interpreter's masked stores and loads counted (one op a launch)."""
    from triton.runtime.interpreter import InterpreterBuilder

    original = vllm_logits_v2.write_rows
    builder_store, builder_load = InterpreterBuilder.create_masked_store, InterpreterBuilder.create_masked_load

    def store(self, ptrs, value, mask, cache_policy):
        counter.kernel_access(ptrs.data, np.broadcast_to(mask.data, ptrs.data.shape), value.data.dtype.itemsize, True)
        return builder_store(self, ptrs, value, mask, cache_policy)

    def load(self, ptrs, mask, other, cache_policy, is_volatile):
        out = builder_load(self, ptrs, mask, other, cache_policy, is_volatile)
        counter.kernel_access(ptrs.data, np.broadcast_to(mask.data, ptrs.data.shape), out.data.dtype.itemsize, False)
        return out

    def wrapped(logits, scale, banned):
        counter.ops += 1
        counter.paused = True
        InterpreterBuilder.create_masked_store, InterpreterBuilder.create_masked_load = store, load
        try:
            original(logits, scale, banned)
        finally:
            InterpreterBuilder.create_masked_store, InterpreterBuilder.create_masked_load = builder_store, builder_load
            counter.paused = False

    return wrapped


def processor_before(commit: str) -> type:
    """The AnswerTemperature class of MODULE at `commit` (at FORMER in a commit before the move)."""
    for path in (MODULE, FORMER):
        try:
            source = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:{path}"], check=True,
                                    capture_output=True, text=True).stdout
            break
        except (OSError, subprocess.CalledProcessError) as err:
            error = err
    else:
        raise SystemExit(f"error: cannot read {MODULE} (or {FORMER}) at {commit} (a git clone of the kit is "
                         f"needed): {error}")
    module = types.ModuleType(f"vllm_logits_v2_{commit}")
    exec(compile(source, f"{commit}:{path}", "exec"), module.__dict__)
    return module.AnswerTemperature


def one_step(processor_class: type, requests: int, drafts: int, vocab: int, past: bool) -> tuple[Counter, int, int]:
    """(the steady step's counter, its logits rows, the rows past </think>) for `requests` requests with `drafts`
    drafts each; `past`: half of them past </think>, else every one thinking."""
    slots = max(requests, 64)
    lengths = lambda n: torch.full((slots,), n, dtype=torch.int32)  # noqa: E731
    # each request arrives with 2,000 tokens of output (as after preemption): its first step finds a </think> there
    state = SimpleNamespace(
        device=torch.device("cpu"), max_num_reqs=slots, vocab_size=vocab,
        all_token_ids=SimpleNamespace(gpu=torch.zeros((slots, MAX_LEN), dtype=torch.int32)),
        prompt_len=SimpleNamespace(gpu=lengths(1000), np=lengths(1000).numpy()),
        prefill_len=SimpleNamespace(gpu=lengths(3000), np=lengths(3000).numpy()), total_len=SimpleNamespace(
            gpu=lengths(3000)))
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=drafts))
    processor = processor_class(config, state)
    order = random.Random(0).sample(range(slots), requests)
    for i, slot in enumerate(order):
        processor.add_request(slot, SamplingParams(extra_args={"answer_scale": 0.5, "think_end_id": THINK,
                                                               "banned_ids": BANNED}))
        if past and i % 2:
            state.all_token_ids.gpu[slot, 2000] = THINK
    processor.apply_staged_writes()
    rows = requests * (1 + drafts)
    idx_mapping = torch.tensor(order, dtype=torch.int64)
    ctx = LogitsContext(
        expanded_idx_mapping=idx_mapping.repeat_interleave(1 + drafts), idx_mapping=idx_mapping,
        idx_mapping_np=np.array(order, dtype=np.intp),
        expanded_local_pos=torch.arange(1 + drafts, dtype=torch.int32).repeat(requests),
        input_ids=torch.full((rows,), 11, dtype=torch.int32),
        pos=(torch.arange(1 + drafts) + 2999).repeat(requests),
        seq_lens_upper_bound_np=np.full(requests, 3000 + drafts, dtype=np.int32))
    logits = torch.zeros(rows, vocab)
    processor.apply(logits, ctx)  # each slot's first step scans its whole output
    counter = Counter(logits)
    kernel = counting_kernel(counter)
    vllm_logits_v2.write_rows, original = kernel, vllm_logits_v2.write_rows
    try:
        with counter:
            processor.apply(logits, ctx)
    finally:
        vllm_logits_v2.write_rows = original
    answer_rows = requests // 2 * (1 + drafts) if past else 0
    assert int(torch.isinf(logits[:, BANNED[0]]).sum()) == answer_rows, "the wrong rows are past </think>"
    return counter, rows, answer_rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="b26e23e", help="the commit whose processor is the baseline")
    args = parser.parse_args()
    engine = load_profile("moe-4xL4").engine
    requests, drafts = engine.max_num_seqs, engine.mtp_speculative_tokens
    vocab = TOPOLOGIES["qwen3-next-80b"].config["vocab_size"]
    classes = {"before": processor_before(args.before), "after": vllm_logits_v2.AnswerTemperature}
    targets = Targets()
    written_bytes = {}
    mib = 2 ** 20
    print(f"moe-4xL4 shape: {requests} requests x {1 + drafts} rows, vocabulary {vocab:,}")
    for label, cls in classes.items():
        for past in (False, True):
            counter, rows, answer_rows = one_step(cls, requests, drafts, vocab, past)
            batch = "half past </think>" if past else "every row thinking"
            print(f"{label}, {batch}: {counter.bytes / mib:.1f} MiB written per step, of which logits "
                  f"{counter.logits_written / mib:.1f} MiB ({counter.logits_written / (rows * vocab):.2f} bytes per "
                  f"logit); logits read by the kernel {counter.logits_read / mib:.1f} MiB")
            written_bytes[label, past] = counter.bytes
            if label == "after":
                answer_bytes = answer_rows * vocab * 4
                targets.at_most(f"after, {batch}: logits bytes written", counter.logits_written, answer_bytes)
                targets.at_most(f"after, {batch}: logits bytes read by the kernel", counter.logits_read, answer_bytes)
        ops = {n: one_step(cls, n, drafts, vocab, True)[0].ops for n in (8, 64)}
        print(f"{label}: {ops[8]} ops at 8 requests, {ops[64]} at 64 (a kernel launch counts one)")
        if label == "after":
            targets.at_most("after: ops at 64 requests - ops at 8", ops[64] - ops[8], 0)
    targets.at_least("bytes written per step with half past </think>, before / after",
                     written_bytes["before", True] / written_bytes["after", True], 1.9)
    return targets.exit_code()


if __name__ == "__main__":
    sys.exit(main())
