"""Per-task test-time training: a fresh LoRA per task on augmented copies of its demonstrations (SPEC section 10).

Each sequence is the task's demonstrations under one view (a dihedral transform, a permutation of all ten colours,
a shuffled order; submission/views.py), cut from the front to fit the context, with the loss on every output grid
and its <eos>. 8 transforms x 16 permutations = 128 sequences, one epoch, batch 1, AdamW without weight decay, lr
5e-5 with 10% warm-up and a cosine decay, gradient norm clipped at 1.0.

The base model is wrapped once per worker (`Adapter`); between tasks the adapter's weights (LoRA matrices and the
fully trained embedding and output layers) are restored from the snapshot taken when it was created, so the base
weights are never reloaded and every task starts from the same adapter. Training stops cleanly at its deadline (the
steps done so far are kept; the report says how many of the planned steps ran).
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from submission.grid.format import KIT16, Encoded, GridFormat, encode
from submission.tasks import Task


@dataclass(frozen=True)
class TTTConfig:
    rank: int = 256
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
    share: float = 0.4  # of the task's time limit, at most
    gradient_checkpointing: bool = False  # on for a 4B model on an L4

    def __post_init__(self) -> None:
        if not 0 < self.sequences <= self.dihedrals * self.colour_perms:
            raise ValueError(f"ttt.sequences must be 1..dihedrals x colour_perms, got {self.sequences}")
        if not 0 <= self.share <= 1 or not 0 <= self.warmup < 1:
            raise ValueError("ttt.share must be in [0, 1] and ttt.warmup in [0, 1)")


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


@dataclass(frozen=True)
class TTTReport:
    planned: int
    steps: int
    losses: tuple[float, ...]
    seconds: float


class Adapter:
    """A base model wrapped once with the task adapter; `reset` makes it fresh, `train` adapts it to one task."""

    def __init__(self, model, config: TTTConfig):
        import torch
        from peft import LoraConfig, get_peft_model, get_peft_model_state_dict

        lora = LoraConfig(r=config.rank, lora_alpha=config.alpha, use_rslora=config.rslora, lora_dropout=0.0,
                          target_modules=list(config.targets), modules_to_save=list(config.full) or None,
                          task_type="CAUSAL_LM")
        self.config = config
        self.model = get_peft_model(model, lora)
        if config.gradient_checkpointing:
            self.model.gradient_checkpointing_enable()
        self._snapshot = {k: v.detach().clone() for k, v in get_peft_model_state_dict(self.model).items()}
        self._torch = torch

    def reset(self) -> None:
        from peft import set_peft_model_state_dict

        with self._torch.no_grad():
            set_peft_model_state_dict(self.model, self._snapshot)

    def train(self, sequences: list[Encoded], deadline: float = math.inf,
              clock: Callable[[], float] = lambda: 0.0) -> TTTReport:
        torch = self._torch
        from transformers import get_cosine_schedule_with_warmup

        start = clock()
        params = [p for p in self.model.parameters() if p.requires_grad]
        optimiser = torch.optim.AdamW(params, lr=self.config.lr, weight_decay=0.0)
        planned = len(sequences)
        schedule = get_cosine_schedule_with_warmup(optimiser, math.ceil(self.config.warmup * planned), planned)
        device = next(self.model.parameters()).device
        losses = []
        self.model.train()
        for encoded in sequences:
            if clock() >= deadline:
                break
            ids = torch.tensor([encoded.ids], device=device)
            labels = ids.masked_fill(~torch.tensor([encoded.output_mask], device=device), -100)
            loss = self.model(input_ids=ids, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, self.config.clip)
            optimiser.step()
            schedule.step()
            optimiser.zero_grad(set_to_none=True)
            losses.append(float(loss.detach()))
        self.model.eval()
        return TTTReport(planned, len(losses), tuple(losses), clock() - start)
