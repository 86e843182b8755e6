"""Per-task test-time training: a LoRA per task on augmented copies of its demonstrations (SPEC section 10).

Each sequence is the task's demonstrations under one view (a dihedral transform, a permutation of all ten colours,
a shuffled order; submission/views.py), cut from the front to fit the context, with the loss on every output grid
and its <eos>. 8 transforms x 16 permutations = 128 sequences, one epoch, batch 1, AdamW without weight decay, lr
5e-5 with 10% warm-up and a cosine decay, gradient norm clipped at 1.0.

The base model is wrapped once per worker (`Adapter`): with a fine-tuned adapter (`model.adapter`, training.grid_tune's
output) its weights are loaded on top of the base as the study ran it (31.1-31.5 against 28.2-28.6 merged, issue 29),
else a fresh LoRA of `ttt`'s shape. Between tasks the adapter's weights (LoRA matrices and the fully trained embedding
and output layers) are restored from the snapshot taken when it was loaded, so the base is never reloaded and every
task starts from the adapter's own weights. Adapters and optimiser state stay in the model's dtype (bf16 on a GPU, as
NVARC trains): PEFT's default upcasts them to fp32, 1.4x slower on an L4.

Training is never cut mid-schedule: before the first step one forward and backward pass of the longest sequence is
timed (the probe), the steps that fit the budget are counted from it (`plan_steps`), and the cosine schedule is
planned over those. The budget comes from the whole run (queue.TrainingPlan): every step, within the task's whole
limit, unless the forecast says the run cannot afford it. A process's first probe is preceded by an untimed pass of
the same sequence (issue 45): CUDA's one-time costs (kernel loading, library handles, the allocator's first blocks)
would otherwise read as step time and cut the first task's training. Gradient checkpointing is on only when the
longest sequence's activations would not fit the free memory (`use_checkpointing`, logged): free as read after the
allocator's cached blocks are given back, less the gradients and AdamW state that training is about to allocate. A
CUDA out-of-memory error in a step clears the gradients, turns checkpointing on and retries that step (one that
fails again is skipped, the schedule still advancing); the steps already taken are kept.
"""

from __future__ import annotations

import math
import random
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from submission.grid.format import KIT16, Encoded, GridFormat, encode
from submission.tasks import Task

CHECKPOINTING = ("auto", "on", "off")


@dataclass(frozen=True)
class TTTConfig:
    rank: int = 256  # a fresh LoRA's shape; a loaded adapter (model.adapter) keeps its own
    alpha: int = 32
    rslora: bool = True  # rank-stabilised scaling alpha / sqrt(rank)
    targets: tuple[str, ...] = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    full: tuple[str, ...] = ("embed_tokens", "lm_head")  # trained in full beside the LoRA
    dihedrals: int = 8
    colour_perms: int = 16
    sequences: int = 128  # at most dihedrals x colour_perms
    lr: float = 5e-5
    warmup: float = 0.1  # share of the steps
    clip: float = 1.0
    share: float = 0.4  # of the task's time limit, at most: the steps that fit are planned before training
    checkpointing: str = "auto"  # auto: only when the longest sequence's activations exceed the free memory
    memory_share: float = 0.8  # of the free memory (after the model, adapter and optimiser) activations may take

    def __post_init__(self) -> None:
        if not 0 < self.sequences <= self.dihedrals * self.colour_perms:
            raise ValueError(f"ttt.sequences must be 1..dihedrals x colour_perms, got {self.sequences}")
        if not 0 <= self.share <= 1 or not 0 <= self.warmup < 1:
            raise ValueError("ttt.share must be in [0, 1] and ttt.warmup in [0, 1)")
        if self.checkpointing not in CHECKPOINTING:
            raise ValueError(f"ttt.checkpointing must be one of {', '.join(CHECKPOINTING)}, got {self.checkpointing!r}")
        if not 0 < self.memory_share <= 1:
            raise ValueError(f"ttt.memory_share must be in (0, 1], got {self.memory_share}")


def training_sequences(task: Task, config: TTTConfig, max_len: int, seed: int = 0,
                       fmt: GridFormat = KIT16) -> list[Encoded]:
    """`config.sequences` augmented copies of the demonstrations, the transforms interleaved so that a short list
    still covers all dihedral transforms; deterministic per task and seed."""
    from submission.views import View, colour_permutation  # numpy: not for a profile's TTTConfig (issue 27)

    rng = random.Random(f"ttt:{seed}:{task.id}")
    out = []
    for i in range(config.sequences):
        order = list(range(len(task.train)))
        rng.shuffle(order)
        view = View(i % config.dihedrals, colour_permutation(rng, keep_zero=False), tuple(order))
        out.append(encode(view.apply(task).train, max_len=max_len, fmt=fmt))
    return [e for e in out if e.shown > 0]


def activation_bytes_per_token(layers: int, hidden: int, intermediate: int, rank: int, vocab: int,
                               dtype_bytes: int) -> int:
    """An estimate of what one token's forward pass keeps for the backward pass without checkpointing, in bytes. Per
    layer: the two RMSNorms (each keeps its input and normalised output, upcast to float32: ~5 x hidden), q/k/v with
    the q/k norms and RoPE, and what attention keeps (q, k, v, its output: ~9 x hidden), o_proj's input and the
    residuals (~6 x hidden), the MLP's gate, up, activation and product (4 x intermediate), each LoRA's rank-wide
    intermediate (7 x rank); then the logits and their float32 log-softmax. An estimate, meant to err high; a GPU
    check measures it (tests/test_grid_ttt.py, requires_gpu) and `ttt.memory_share` is its margin."""
    return layers * (20 * hidden + 4 * intermediate + 7 * rank) * dtype_bytes + vocab * (dtype_bytes + 8)


def training_state_bytes(trainable: int, dtype_bytes: int) -> int:
    """What training allocates beside the activations for `trainable` parameters: their gradients and AdamW's two
    moments, each in the parameters' dtype (the adapter's, as torch's AdamW keeps its state). Pure."""
    return 3 * trainable * dtype_bytes


def use_checkpointing(mode: str, longest: int, per_token_bytes: int, free_bytes: float,
                      memory_share: float, state_bytes: int = 0) -> tuple[bool, str]:
    """Whether to checkpoint a task's training, and why (the log line). `free_bytes`: free now, before training;
    `state_bytes`: what training will allocate besides activations (`training_state_bytes`), taken from it. Pure."""
    if mode != "auto":
        return mode == "on", f"ttt.checkpointing = {mode}"
    need = longest * per_token_bytes
    room = free_bytes - state_bytes
    fits = need <= memory_share * room
    return not fits, (f"longest sequence {longest} tokens needs ~{need / 2**30:.2f} GiB of activations, "
                      f"{memory_share:.0%} of {room / 2**30:.2f} GiB free ({free_bytes / 2**30:.2f} GiB less "
                      f"{state_bytes / 2**30:.2f} GiB of gradients and optimiser state): checkpointing "
                      f"{'off' if fits else 'on'}")


def free_memory(torch, device) -> float:
    """Free memory on `device` once the allocator's cached blocks are given back (mem_get_info counts them as
    used); a CPU's is not measured (host memory, no checkpointing needed)."""
    if device.type != "cuda":
        return math.inf
    torch.cuda.empty_cache()
    return torch.cuda.mem_get_info(device)[0]


def plan_steps(lengths: Sequence[int], budget_s: float, probe_s: float, probe_len: int) -> int:
    """How many of the sequences (in order) train within `budget_s`, the probe already spent. A step's time is the
    probe's scaled by its length: attention grows faster than linearly, so scaling down from the longest sequence
    overestimates the shorter ones (never plans a step that cannot finish). Pure."""
    if math.isinf(budget_s):
        return len(lengths)
    left, steps = budget_s - probe_s, 0
    for n in lengths:
        left -= probe_s * n / probe_len
        if left < 0:
            break
        steps += 1
    return steps


@dataclass(frozen=True)
class TTTReport:
    planned: int  # the steps the schedule was planned over, all of which ran
    steps: int
    losses: tuple[float, ...]
    seconds: float
    checkpointing: bool = False  # at the end (an out-of-memory retry turns it on)
    oom_retries: int = 0
    skipped: int = 0  # steps whose sequence did not fit even with checkpointing (the schedule still advanced)
    lrs: tuple[float, ...] = ()  # each step's learning rate: the schedule ends at the last step that ran
    why: str = ""  # why fewer steps were planned than there are sequences ("" when all were)


class Adapter:
    """A base model wrapped once with the task adapter; `reset` restores the adapter's weights, `train` adapts it to
    one task. `adapter`: a PEFT adapter folder to load on the base (its own rank and targets), "" for a fresh LoRA;
    a model wrapped already (a PeftModel) is taken as it is."""

    def __init__(self, model, config: TTTConfig, adapter: str = "",
                 log: Callable[[str], None] = lambda line: print(line, file=sys.stderr)):
        import torch
        from peft import LoraConfig, PeftModel, get_peft_model, get_peft_model_state_dict

        self.config, self.log, self._torch = config, log, torch
        if isinstance(model, PeftModel):  # wrapped already (unsloth's get_peft_model: submission.grid.model)
            self.model = model
        elif adapter:  # as saved: is_trainable keeps its LoRA and modules_to_save trainable for the task's training
            self.model = PeftModel.from_pretrained(model, adapter, is_trainable=True, autocast_adapter_dtype=False)
        else:
            lora = LoraConfig(r=config.rank, lora_alpha=config.alpha, use_rslora=config.rslora, lora_dropout=0.0,
                              target_modules=list(config.targets), modules_to_save=list(config.full) or None,
                              task_type="CAUSAL_LM")
            self.model = get_peft_model(model, lora, autocast_adapter_dtype=False)
        self.checkpointing = False
        self.warm = False  # a pass has run in this process: CUDA's one-time costs are paid
        self.start = {  # the adapter's weights every task starts from
            k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model).items()}

    def reset(self) -> None:
        from peft import set_peft_model_state_dict

        with self._torch.no_grad():
            set_peft_model_state_dict(self.model, self.start)

    def set_checkpointing(self, on: bool) -> None:
        if on and not self.checkpointing:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        elif not on and self.checkpointing:
            self.model.gradient_checkpointing_disable()
        self.checkpointing = on

    def per_token_bytes(self) -> int:
        from peft.tuners.lora import LoraLayer

        c = self.model.get_base_model().config
        rank = max((max(m.r.values(), default=0) for m in self.model.modules() if isinstance(m, LoraLayer)),
                   default=0)
        dtype_bytes = next(self.model.parameters()).element_size()
        return activation_bytes_per_token(c.num_hidden_layers, c.hidden_size, c.intermediate_size, rank,
                                          c.vocab_size, dtype_bytes)

    def free_bytes(self) -> float:
        """Free memory on the model's device (`free_memory`)."""
        return free_memory(self._torch, next(self.model.parameters()).device)

    def state_bytes(self) -> int:
        """The gradients and optimiser state training allocates (`training_state_bytes`); none exist before it."""
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        return training_state_bytes(sum(p.numel() for p in trainable), trainable[0].element_size() if trainable else 0)

    def _backward(self, encoded: Encoded, log: Callable[[str], None]):
        """One forward and backward pass: (loss, out-of-memory retries), loss None when skipped. On a CUDA
        out-of-memory error the gradients are cleared and the pass retried with checkpointing on; one that fails
        with checkpointing on as well is skipped (its gradients cleared), so the planned schedule still runs out."""
        torch = self._torch
        device = next(self.model.parameters()).device
        ids = torch.tensor([encoded.ids], device=device)
        labels = ids.masked_fill(~torch.tensor([encoded.output_mask], device=device), -100)
        retries = 0
        while True:
            try:
                loss = self.model(input_ids=ids, labels=labels).loss
                loss.backward()
                return loss, retries
            except torch.OutOfMemoryError:
                loss = None
                self.model.zero_grad(set_to_none=True)
                if device.type == "cuda":
                    torch.cuda.empty_cache()
                retries += 1
                if self.checkpointing:
                    log(f"ttt: out of memory on a {len(encoded.ids)}-token sequence with checkpointing on: "
                        f"gradients cleared, the sequence skipped")
                    return None, retries
                log(f"ttt: out of memory on a {len(encoded.ids)}-token sequence: gradients cleared, "
                    f"checkpointing on, the step retried")
                self.set_checkpointing(True)

    def train(self, sequences: list[Encoded], budget_s: float = math.inf,
              clock: Callable[[], float] = time.monotonic, free_bytes: float | None = None,
              log: Callable[[str], None] | None = None) -> TTTReport:
        """Adapt to one task within `budget_s` seconds: the steps that fit are decided first and all of them run.
        `log`: where this task's lines go (solve_task's, which names the task); default the adapter's."""
        torch = self._torch
        from transformers import get_cosine_schedule_with_warmup

        log = log or self.log
        start = clock()
        longest = max(sequences, key=lambda e: len(e.ids))
        self.model.zero_grad(set_to_none=True)  # none left from before: the state counted below is all to come
        on, why = use_checkpointing(self.config.checkpointing, len(longest.ids), self.per_token_bytes(),
                                    self.free_bytes() if free_bytes is None else free_bytes, self.config.memory_share,
                                    self.state_bytes())
        log(f"ttt: {why}")
        self.set_checkpointing(on)
        self.model.train()
        retries = 0
        planned, fewer = len(sequences), ""
        if not math.isinf(budget_s):  # the probe: one timed pass of the longest sequence, its gradients dropped
            if not self.warm:  # the process's first pass pays CUDA's one-time costs: untimed
                retries += self._backward(longest, log)[1]
                self.model.zero_grad(set_to_none=True)
            probe_start = clock()
            _, retried = self._backward(longest, log)
            retries += retried
            self.model.zero_grad(set_to_none=True)
            probe_s = clock() - probe_start
            left = budget_s - (probe_start - start)
            planned = plan_steps([len(e.ids) for e in sequences], left, probe_s, len(longest.ids))
            line = (f"probe {probe_s:.2f} s for {len(longest.ids)} tokens{'' if self.warm else ' (after a warm-up)'}"
                    f": {planned} of {len(sequences)} steps fit {left:.0f} s")
            fewer = line if planned < len(sequences) else ""
            log(f"ttt: {line}")
        self.warm = True
        params = [p for p in self.model.parameters() if p.requires_grad]
        optimiser = torch.optim.AdamW(params, lr=self.config.lr, weight_decay=0.0)
        schedule = get_cosine_schedule_with_warmup(optimiser, math.ceil(self.config.warmup * planned), planned)
        losses, lrs = [], []
        skipped = 0
        for encoded in sequences[:planned]:
            loss, retried = self._backward(encoded, log)
            retries += retried
            lrs.append(schedule.get_last_lr()[0])
            if loss is None:
                skipped += 1
            else:
                torch.nn.utils.clip_grad_norm_(params, self.config.clip)
                optimiser.step()
                losses.append(float(loss.detach()))
            schedule.step()
            optimiser.zero_grad(set_to_none=True)
        self.model.eval()
        return TTTReport(planned, len(lrs), tuple(losses), clock() - start, self.checkpointing, retries, skipped,
                         tuple(lrs), fewer)
