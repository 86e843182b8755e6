"""Per-step cost of the V2 answer-temperature processor at the moe-4xL4 shape (issue 31), on CPU tensors.

    python benchmarks/v2_processor.py [--before 43804fb]   # the engine environment (make engine-env)

The shape: the profile's `max_num_seqs` requests (64), each with 1 + `mtp_speculative_tokens` logits rows (5): 320
rows of the vocabulary of moe-4xL4's model, the pruned Qwen3-Next-80B-A3B (pruning keeps the vocabulary:
build.topology, 151,936 tokens). Rows laid out as vLLM 0.33's Model Runner V2 lays them out (int32 input ids and local
positions, slots in a shuffled batch order; tests/test_vllm_v2_inputs.py); half of the requests are past `</think>`.
One steady step is measured, after the step that admits the requests.

Bytes written are counted per dispatched aten op (a TorchDispatchMode): a new tensor's bytes, the whole tensor for an
in-place elementwise op, the indexed elements for a scatter or an indexed write, nothing for a view. "Before" is the
processor at --before (issue 31's starting point, read with `git show`), "after" the working tree's.

Targets: before / after >= 2.4 bytes written (the expected factor is 2.5: before, 10 bytes per logit, a `div_` and a
`masked_fill_` over the logits (4 + 4) and two boolean [rows, vocab] temporaries (1 + 1); after, 4, its `div_`); and
the same dispatched op count at 8 and at 64 requests.
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

from build.topology import TOPOLOGIES  # noqa: E402
from submission.engines import vllm_logits_v2  # noqa: E402
from submission.profiles import load_profile  # noqa: E402
from targets import Targets  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
MODULE = "submission/engines/vllm_logits_v2.py"
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
    def __init__(self):
        super().__init__()
        self.ops = 0
        self.bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops += 1
        self.bytes += written(func, args, out)
        return out


def processor_before(commit: str) -> type:
    """The AnswerTemperature class of MODULE at `commit`."""
    try:
        source = subprocess.run(["git", "-C", str(REPO), "show", f"{commit}:{MODULE}"], check=True,
                                capture_output=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as err:
        raise SystemExit(f"error: cannot read {MODULE} at {commit} (a git clone of the kit is needed): {err}")
    module = types.ModuleType(f"vllm_logits_v2_{commit}")
    exec(compile(source, f"{commit}:{MODULE}", "exec"), module.__dict__)
    return module.AnswerTemperature


def one_step(processor_class: type, requests: int, drafts: int, vocab: int) -> tuple[Counter, int]:
    """(the steady step's counter, its logits rows) for `requests` requests with `drafts` drafts each."""
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
        if i % 2:
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
    counter = Counter()
    with counter:
        processor.apply(logits, ctx)
    past = int(torch.isinf(logits[:, BANNED[0]]).sum())
    assert past == requests // 2 * (1 + drafts), f"{past} rows past </think>, not half of {rows}"
    return counter, rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", default="43804fb", help="the commit whose processor is the baseline")
    args = parser.parse_args()
    engine = load_profile("moe-4xL4").engine
    requests, drafts = engine.max_num_seqs, engine.mtp_speculative_tokens
    vocab = TOPOLOGIES["qwen3-next-80b"].config["vocab_size"]
    classes = {"before": processor_before(args.before), "after": vllm_logits_v2.AnswerTemperature}
    targets = Targets()
    written_bytes = {}
    print(f"moe-4xL4 shape: {requests} requests x {1 + drafts} rows, vocabulary {vocab:,}")
    for label, cls in classes.items():
        counter, rows = one_step(cls, requests, drafts, vocab)
        written_bytes[label] = counter.bytes
        ops = {n: one_step(cls, n, drafts, vocab)[0].ops for n in (8, 64)}
        print(f"{label}: {counter.bytes / 2**20:.1f} MiB written per step ({counter.bytes / (rows * vocab):.2f} bytes "
              f"per logit), {ops[8]} ops at 8 requests, {ops[64]} at 64")
        if label == "after":
            targets.at_most("after: ops at 64 requests - ops at 8", ops[64] - ops[8], 0)
    targets.at_least("bytes written per step, before / after", written_bytes["before"] / written_bytes["after"], 2.4)
    return targets.exit_code()


if __name__ == "__main__":
    sys.exit(main())
