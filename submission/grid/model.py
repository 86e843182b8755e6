"""The grid model in transformers: loading, the search's `Stepper` with a rolled-back KV cache, answer likelihoods.

Torch and transformers are imported here only, so the policy modules (format, dfs, rescore, queue) stay importable
and testable without them.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from submission.grid.format import PAD, VOCAB


def load_model(model_dir: str | Path, dtype: str = "bfloat16", device: str = "cpu"):
    """A checkpoint made by build.grid_vocab, in eval mode; refuses any other vocabulary."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device)
    if model.config.vocab_size != VOCAB:
        raise ValueError(f"{model_dir}/config.json: vocab_size is {model.config.vocab_size}, the grid line needs "
                         f"{VOCAB} (cut the checkpoint with python -m build.grid_vocab)")
    return model.eval()


class HFStepper:
    """`dfs.Stepper` over a transformers causal LM: one DynamicCache, extended per token and cropped on return.

    `preload(prompts)` prefills several prompts (the views of one search batch) in one model call, right-padded and
    masked, and keeps each prompt's own slice of the cache; a later `prefill` of one of them starts from its slice
    instead of running the prompt again. With right padding every real position sees only its own prompt, so a slice
    is that prompt's cache up to float rounding."""

    def __init__(self, model):
        self.model = model
        self.device = next(model.parameters()).device
        self.cache = None
        self._length = 0
        self._preloaded: dict[tuple[int, ...], tuple[list, np.ndarray]] = {}

    @torch.no_grad()
    def preload(self, prompts: Sequence[Sequence[int]]) -> None:
        from transformers import DynamicCache

        width = max(len(ids) for ids in prompts)
        x = torch.full((len(prompts), width), PAD, device=self.device)
        mask = torch.zeros((len(prompts), width), dtype=torch.long, device=self.device)
        for row, ids in enumerate(prompts):
            x[row, :len(ids)] = torch.tensor(list(ids), device=self.device)
            mask[row, :len(ids)] = 1
        self.forget()
        cache = DynamicCache(config=self.model.config)
        logits = self.model(input_ids=x, attention_mask=mask, past_key_values=cache, use_cache=True).logits
        for row, ids in enumerate(prompts):
            n = len(ids)
            layers = [(layer.keys[row:row + 1, :, :n].clone(), layer.values[row:row + 1, :, :n].clone())
                      for layer in cache.layers]
            logp = torch.log_softmax(logits[row, n - 1].float(), -1).cpu().numpy()
            self._preloaded[tuple(ids)] = (layers, logp)

    @property
    def length(self) -> int:
        return self._length

    @torch.no_grad()
    def _run(self, ids: Sequence[int]) -> np.ndarray:
        from transformers import DynamicCache

        if self.cache is None:
            self.cache = DynamicCache(config=self.model.config)
        x = torch.tensor([list(ids)], device=self.device)
        out = self.model(input_ids=x, past_key_values=self.cache, use_cache=True)
        self._length += len(ids)
        return torch.log_softmax(out.logits[0, -1].float(), -1).cpu().numpy()

    def forget(self) -> None:
        """Drop the preloaded caches not used (a deadline cut their batch short): their memory is freed."""
        self._preloaded.clear()

    def prefill(self, ids: Sequence[int]) -> np.ndarray:
        from transformers import DynamicCache

        loaded = self._preloaded.pop(tuple(ids), None)
        if loaded is None:
            self.cache, self._length = None, 0
            return self._run(ids)
        layers, logp = loaded
        self.cache, self._length = DynamicCache(layers, config=self.model.config), len(ids)
        return logp

    def push(self, token: int) -> np.ndarray:
        return self._run([token])

    def truncate(self, length: int) -> None:
        # a negative crop removes that many tokens; the positive form (a target length) is deprecated in 5.x
        if length < self._length:
            self.cache.crop(length - self._length)
        self._length = length


@torch.no_grad()
def answer_nlls(model, items: Sequence[tuple[Sequence[int], int]]) -> list[float]:
    """Per item (token ids, answer length): the negative log-likelihood (nats, float32 sum) of the last `answer
    length` tokens given the rest; all items in one forward pass, right-padded with <pad> and masked (a padded
    position is never attended to and never scored, so each result is its unbatched value up to float rounding)."""
    device = next(model.parameters()).device
    width = max(len(ids) for ids, _ in items)
    x = torch.full((len(items), width), PAD, device=device)
    mask = torch.zeros((len(items), width), dtype=torch.long, device=device)
    for row, (ids, _) in enumerate(items):
        x[row, :len(ids)] = torch.tensor(list(ids), device=device)
        mask[row, :len(ids)] = 1
    logits = model(input_ids=x, attention_mask=mask, use_cache=False).logits
    out = []
    for row, (ids, answer_len) in enumerate(items):
        logp = torch.log_softmax(logits[row, len(ids) - answer_len - 1:len(ids) - 1].float(), -1)
        target = x[row, len(ids) - answer_len:len(ids)]
        out.append(float(-logp.gather(1, target[:, None]).sum()))
    return out
