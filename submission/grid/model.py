"""The grid model in transformers: loading (with its adapter), the search's `Stepper` with a rolled-back KV cache,
answer likelihoods, the out-of-memory retries' helpers.

The search's caches are preallocated (`_Preallocated`): transformers' DynamicLayer appends a token with `torch.cat`,
a copy of the whole cache per token, per layer; the search writes the token into its slot and crops by shortening a
view (issue 29).

The lockstep search's decode steps attend without copying the cache (`grouped_decode_attention`, issue 45): with an
attention mask (its rows' masked slots), transformers' SDPA path repeats every key and value head for grouped-query
attention (`repeat_kv`, sdpa_attention.py's `use_gqa_in_sdpa` is False whenever a mask is given on CUDA), a copy of
the whole cache per layer per step, 4x the cache at Qwen3-4B's 32 query / 8 KV heads. One decode token's query heads
are instead grouped by the KV head they share and attend as that head's queries: the same attention, no copy.

Torch and transformers are imported here only (this module is imported in the worker processes), so the policy
modules (format, dfs, rescore, queue) stay importable and testable without them.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import torch
from transformers import AttentionInterface, DynamicCache
from transformers.cache_utils import DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

from submission.grid.profile import ModelConfig
from submission.grid.format import PAD, VOCAB
from submission.grid.ttt import Adapter, TTTConfig

ANSWER_ROOM = 931  # a 30 x 30 grid, its newlines and <eos>: what a search cache holds beyond its prompt


def load_model(model_dir: str | Path, dtype: str = "bfloat16", device: str = "cpu"):
    """A checkpoint made by build.models.grid_vocab, in eval mode; refuses any other vocabulary."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(device)
    if model.config.vocab_size != VOCAB:
        raise ValueError(f"{model_dir}/config.json: vocab_size is {model.config.vocab_size}, the grid line needs "
                         f"{VOCAB} (cut the checkpoint with python -m build.models.grid_vocab)")
    return model.eval()


def training_backend(config: ModelConfig) -> str:
    """"unsloth" or "peft": `model.backend`, auto meaning unsloth wherever its environment is installed."""
    if config.backend != "auto":
        return config.backend
    return "unsloth" if importlib.util.find_spec("unsloth") is not None else "peft"


def _unsloth_base(config: ModelConfig, device: str):
    """The base through unsloth (its patched kernels), refused unless it has the grid vocabulary."""
    import unsloth  # noqa: F401 - unsloth patches transformers on import
    from transformers import AutoConfig
    from unsloth import FastLanguageModel

    longest = AutoConfig.from_pretrained(config.path).max_position_embeddings  # no RoPE scaling: the model's own
    model, _ = FastLanguageModel.from_pretrained(model_name=config.path, max_seq_length=longest,
                                                 dtype=getattr(torch, config.dtype), load_in_4bit=False,
                                                 use_gradient_checkpointing=False, device_map=device)
    if model.config.vocab_size != VOCAB:
        raise ValueError(f"{config.path}/config.json: vocab_size is {model.config.vocab_size}, the grid line needs "
                         f"{VOCAB} (cut the checkpoint with python -m build.models.grid_vocab)")
    return model


def load_adapter(config: ModelConfig, ttt: TTTConfig, device: str = "cpu") -> Adapter:
    """A worker's model: the base with `config.adapter` loaded on top (the study's adapter-loaded runs; each task
    starts from the adapter's own weights), or with `config.merge` the adapter merged into the base and a fresh LoRA
    of `ttt`'s shape trained on that (the study's merged runs); no adapter: a fresh LoRA on the base. Through
    unsloth where `training_backend` says so (the same adapter, its kernels: NVARC trained with unsloth)."""
    from peft import PeftModel

    adapter = config.adapter_dir()
    if adapter and not (Path(adapter) / "adapter_config.json").is_file():
        raise ValueError(f"model.adapter: {adapter}/adapter_config.json is missing (a PEFT adapter folder, "
                         f"training.grid_tune's out/adapter)")
    unsloth = training_backend(config) == "unsloth"
    base = _unsloth_base(config, device) if unsloth else load_model(config.path, config.dtype, device)
    if adapter and config.merge:
        base, adapter = PeftModel.from_pretrained(base, adapter).merge_and_unload(), ""
    if adapter or not unsloth:
        return Adapter(base, ttt, adapter)
    from unsloth import FastLanguageModel

    return Adapter(FastLanguageModel.get_peft_model(
        base, r=ttt.rank, lora_alpha=ttt.alpha, lora_dropout=0.0, target_modules=list(ttt.targets),
        use_rslora=ttt.rslora, modules_to_save=list(ttt.full) or None, use_gradient_checkpointing=False,
        random_state=0), ttt)


OutOfMemory = torch.OutOfMemoryError  # what a CUDA allocation that does not fit raises


def release(model) -> None:
    """Give the memory of a stage that ran out of it back to the allocator before the stage is retried smaller."""
    if next(model.parameters()).device.type == "cuda":
        torch.cuda.empty_cache()


def split_on_oom(nlls: Callable[[Sequence], Sequence[float]], model,
                 log: Callable[[str], None] = lambda line: print(line, file=sys.stderr)):
    """`nlls` (answer_nlls over a batch of sequences) that halves a batch which runs out of memory and scores the
    halves, down to one sequence (whose error is raised): the rescoring keeps the views scored before it."""
    def run(items: Sequence) -> list[float]:
        try:
            return list(nlls(items))
        except OutOfMemory:
            if len(items) == 1:
                raise
            release(model)
            log(f"rescoring: out of memory on {len(items)} sequences in one call: halved")
            return run(items[:len(items) // 2]) + run(items[len(items) // 2:])
    return run


class HFStepper:
    """`dfs.Stepper` over a transformers causal LM: one DynamicCache, extended per token and cropped on return.

    `preload(prompts)` prefills several prompts (the views of one search batch) in one model call, right-padded and
    masked, and keeps each prompt's own slice of the cache; a later `prefill` of one of them starts from its slice
    instead of running the prompt again. With right padding every real position sees only its own prompt, so a slice
    is that prompt's cache up to float rounding."""

    def __init__(self, model, room: int = ANSWER_ROOM):
        self.model, self.room = model, room
        self.device = next(model.parameters()).device
        self.cache = None
        self._length = 0
        self._preloaded: dict[tuple[int, ...], tuple[list, np.ndarray]] = {}

    def preload(self, prompts: Sequence[Sequence[int]]) -> None:
        self.forget()
        cache, logps = _padded_prefill(self.model, prompts)
        for row, ids in enumerate(prompts):
            n = len(ids)
            layers = [(layer.keys[row:row + 1, :, :n].clone(), layer.values[row:row + 1, :, :n].clone())
                      for layer in cache.layers]
            self._preloaded[tuple(ids)] = (layers, logps[row][0])

    @property
    def length(self) -> int:
        return self._length

    @torch.no_grad()
    def _run(self, ids: Sequence[int], rows: int = 1) -> np.ndarray:
        """Run `ids` on the cache; the next-token log-probabilities after each of the last `rows` of them."""
        x = torch.tensor([list(ids)], device=self.device)
        out = self.model(input_ids=x, past_key_values=self.cache, use_cache=True)
        self._length += len(ids)
        return torch.log_softmax(out.logits[0, len(ids) - rows:].float(), -1).cpu().numpy()

    def forget(self) -> None:
        """Drop the preloaded caches not used (a deadline cut their batch short): their memory is freed."""
        self._preloaded.clear()

    def prefill(self, ids: Sequence[int], guess: Sequence[int] = ()) -> np.ndarray:
        self.cache, self._length = _new_cache(self.model, len(ids) + self.room), 0
        loaded = self._preloaded.pop(tuple(ids), None)
        if loaded is None:
            return self._run([*ids, *guess], len(guess) + 1)
        layers, logp = loaded
        for layer, (keys, values) in zip(self.cache.layers, layers):
            layer.update(keys, values)
        self._length = len(ids)
        return np.stack([logp, *(self._run(guess, len(guess)) if guess else ())])

    def push(self, token: int) -> np.ndarray:
        return self._run([token])[0]

    def truncate(self, length: int) -> None:
        # a negative crop removes that many tokens; the positive form (a target length) is deprecated in 5.x
        if length < self._length:
            self.cache.crop(length - self._length)
        self._length = length


class HFBatchStepper:
    """`dfs.BatchStepper` over a transformers causal LM: one DynamicCache with a row per view (`search.dfs_batch`).

    The rows' sequences grow and go back by different amounts, while a DynamicCache has one length for all rows: so
    every step appends one slot to every row, and going back masks a row's slots out instead of cropping them. A
    row's sequence is its prompt's slots (right-padded at the prefill) then its path, the slots of its tokens after
    the prompt, in order; the attention mask shows each row only its own sequence, and each token gets its position
    in that sequence explicitly, so every row computes what a cache of its own would, up to float rounding. Masked
    slots cost attention and memory only; once `slack` of them lie beyond the longest row the cache is compacted
    (each row's slots gathered to the front). A finished row is dropped with `batch_select_indices`, as beam search
    drops beams. With `together` the prompts are prefilled in one model call (`search.preload`), else one at a time
    (one prompt's activations and cache beside the batch's cache at a time). Each step attends without copying the
    cache (`grouped_decode_attention`; `grouped=False`: transformers' SDPA path, which repeats the KV heads, kept for
    benchmarks/grid_search.py's comparison)."""

    def __init__(self, model, together: bool = False, slack: int = 64, room: int = ANSWER_ROOM,
                 grouped: bool = True):
        self.model = model
        self.grouped = _Grouped(model) if grouped else contextlib.nullcontext()
        self.device = next(model.parameters()).device
        self.together, self.slack, self.room = together, slack, room
        if any(type(layer) is not DynamicLayer for layer in DynamicCache(config=model.config).layers):
            raise ValueError("search.dfs_batch > 1 needs full attention in every layer (a sliding-window layer "
                             "drops slots by position, which the masked rows do not follow); set dfs_batch = 1")

    @torch.no_grad()
    def prefill(self, prompts: Sequence[Sequence[int]],
                guesses: Sequence[Sequence[int]] | None = None) -> list[np.ndarray]:
        """Each row is its prompt then its guess; the guess's slots are the row's first path slots, so going back
        into the guess masks them out like any other branch's."""
        guesses = guesses or [()] * len(prompts)
        rows = [[*ids, *guess] for ids, guess in zip(prompts, guesses)]
        scored = [len(guess) + 1 for guess in guesses]
        width = max(len(ids) for ids in rows)
        if self.together:
            self.cache, logps = _padded_prefill(self.model, rows, scored, self.room)
        else:
            layers, logps = [], []
            for row, ids in enumerate(rows):  # each prompt's cache copied into its row, then freed
                cache, logp = _padded_prefill(self.model, [ids], scored[row:row + 1])
                logps += logp
                for i, layer in enumerate(cache.layers):
                    if row == 0:  # zeros: a padded slot is masked, never read
                        layers.append(tuple(x.new_zeros((len(rows), x.shape[1], width, x.shape[3]))
                                            for x in (layer.keys, layer.values)))
                    layers[i][0][row, :, :len(ids)] = layer.keys[0]
                    layers[i][1][row, :, :len(ids)] = layer.values[0]
            self.cache = _new_cache(self.model, width + self.room)
            for layer, (keys, values) in zip(self.cache.layers, layers):
                layer.update(keys, values)
        self.rows = list(range(len(prompts)))  # the caller's number of each cache row
        self.prompt_len = [len(ids) for ids in prompts]
        self.paths: list[list[int]] = [list(range(len(ids), len(row))) for ids, row in zip(prompts, rows)]
        self.mask = (torch.arange(width, device=self.device)
                     < torch.tensor([len(row) for row in rows], device=self.device)[:, None]).long()
        return logps

    @torch.no_grad()
    def push(self, moves: Sequence[tuple[int, int, int]]) -> np.ndarray:
        if len(moves) < len(self.rows):  # finished rows leave the batch
            keep = [self.rows.index(row) for row, _, _ in moves]
            self.cache.batch_select_indices(torch.tensor(keep, device=self.device))
            self.mask = self.mask[keep]
            self.rows, self.prompt_len, self.paths = ([items[i] for i in keep]
                                                      for items in (self.rows, self.prompt_len, self.paths))
        for row, (path, prompt_len, (_, length, _)) in enumerate(zip(self.paths, self.prompt_len, moves)):
            if length - prompt_len < len(path):  # back to the branch point: its later slots are masked out
                self.mask[row, path[length - prompt_len:]] = 0
                del path[length - prompt_len:]
        slot = self.mask.shape[1]
        self.mask = torch.cat([self.mask, self.mask.new_ones((len(moves), 1))], 1)
        ids = torch.tensor([[token] for _, _, token in moves], device=self.device)
        positions = torch.tensor([[length] for _, length, _ in moves], device=self.device)
        with self.grouped:
            logits = self.model(input_ids=ids, attention_mask=self.mask, position_ids=positions,
                                past_key_values=self.cache, use_cache=True).logits[:, -1]
        for path in self.paths:
            path.append(slot)
        if slot + 1 - max(n + len(path) for n, path in zip(self.prompt_len, self.paths)) >= self.slack:
            self._compact()
        return torch.log_softmax(logits.float(), -1).cpu().numpy()

    def _compact(self) -> None:
        """Each row's slots gathered to the front: the masked slots' memory and attention are given back."""
        lengths = [n + len(path) for n, path in zip(self.prompt_len, self.paths)]
        width = max(lengths)
        index = torch.zeros((len(lengths), width), dtype=torch.long, device=self.device)
        for row, (n, path) in enumerate(zip(self.prompt_len, self.paths)):
            index[row, :n] = torch.arange(n, device=self.device)
            index[row, n:n + len(path)] = torch.tensor(path, dtype=torch.long, device=self.device)
        for layer in self.cache.layers:
            gather = index[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            layer.keys, layer.values = layer.keys.gather(2, gather), layer.values.gather(2, gather)
        self.mask = (torch.arange(width, device=self.device)
                     < torch.tensor(lengths, device=self.device)[:, None]).long()
        self.paths = [list(range(n, m)) for n, m in zip(self.prompt_len, lengths)]


GROUPED = "grid_grouped_sdpa"  # the attention implementation HFBatchStepper decodes with


def grouped_decode_attention(module, query, key, value, attention_mask, dropout: float = 0.0, scaling=None,
                             is_causal=None, **kwargs):
    """transformers' SDPA attention, except for one decode token with a mask and grouped KV heads: query head
    `kv * groups + g` (repeat_kv's order) attends to KV head `kv`, so the (batch, heads, 1, dim) query is regrouped to
    (batch, kv heads, groups, dim) and attends to the cache's own keys and values, the (batch, 1, 1, slots) mask
    broadcast over the groups. SDPA sees plain attention with as many queries as groups: no KV copy, and no reliance
    on any kernel's grouped-query support (a masked `enable_gqa` falls back to a kernel that copies too)."""
    groups = getattr(module, "num_key_value_groups", 1)
    if query.shape[2] != 1 or attention_mask is None or groups == 1 or kwargs.get("position_bias") is not None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      is_causal=is_causal, **kwargs)
    batch, heads, _, dim = query.shape
    grouped = query.reshape(batch, key.shape[1], groups, dim)
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=attention_mask,
                                                           dropout_p=dropout, scale=scaling)
    return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None


class _Grouped:
    """While active, `model` attends with `grouped_decode_attention` (its masks built as SDPA's) if it attends with
    SDPA; any other implementation is left alone."""

    def __init__(self, model):
        self.config = model.config
        AttentionInterface.register(GROUPED, grouped_decode_attention)
        AttentionMaskInterface.register(GROUPED, sdpa_mask)

    def __enter__(self):
        self.was = self.config._attn_implementation
        if self.was == "sdpa":
            self.config._attn_implementation = GROUPED

    def __exit__(self, *exc):
        self.config._attn_implementation = self.was


class _Preallocated(DynamicLayer):
    """Keys and values are views of buffers with room for `capacity` slots, so appending a token writes one slot
    and `crop` (DynamicLayer's) only shortens the views. A row selection or a compaction (HFBatchStepper) replaces
    the views with fresh tensors; the next append copies them into a new buffer once. Past the capacity the buffer
    doubles."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity, self.buffers = capacity, None

    def lazy_initialization(self, key_states, value_states) -> None:
        super().lazy_initialization(key_states, value_states)
        self.keys, self.values = (x[..., :0, :] for x in (key_states, value_states))

    def update(self, key_states, value_states, *args, **kwargs):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        n, q = self.keys.shape[-2], key_states.shape[-2]
        if not self._in_buffers() or n + q > self.buffers[0].shape[-2]:
            size = max(self.capacity, n + q, 2 * n)
            self.buffers = tuple(x.new_empty((*x.shape[:2], size, x.shape[3])) for x in (key_states, value_states))
            for buffer, old in zip(self.buffers, (self.keys, self.values)):
                buffer[..., :n, :] = old
        for buffer, new in zip(self.buffers, (key_states, value_states)):
            buffer[..., n:n + q, :] = new
        self.keys, self.values = (buffer[..., :n + q, :] for buffer in self.buffers)
        return self.keys, self.values

    def _in_buffers(self) -> bool:
        return self.buffers is not None and all(x.data_ptr() == b.data_ptr() and x.shape[0] == b.shape[0]
                                                for x, b in zip((self.keys, self.values), self.buffers))


def _new_cache(model, capacity: int):
    """A DynamicCache whose full-attention layers are preallocated for `capacity` slots (a sliding-window layer,
    which drops slots by position, stays as transformers makes it)."""
    cache = DynamicCache(config=model.config)
    cache.layers = [_Preallocated(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


@torch.no_grad()
def _padded_prefill(model, prompts: Sequence[Sequence[int]], scored: Sequence[int] | None = None, room: int = 0):
    """The prompts in one model call, right-padded with <pad> and masked: the cache (one row per prompt, real
    positions seeing only their own prompt; `room` slots preallocated beyond the longest) and each prompt's
    next-token log-probabilities after its last `scored` tokens (one row each; default 1)."""
    device = next(model.parameters()).device
    width = max(len(ids) for ids in prompts)
    x = torch.full((len(prompts), width), PAD, device=device)
    mask = torch.zeros((len(prompts), width), dtype=torch.long, device=device)
    for row, ids in enumerate(prompts):
        x[row, :len(ids)] = torch.tensor(list(ids), device=device)
        mask[row, :len(ids)] = 1
    cache = _new_cache(model, width + room)
    logits = model(input_ids=x, attention_mask=mask, past_key_values=cache, use_cache=True).logits
    scored = scored or [1] * len(prompts)
    return cache, [torch.log_softmax(logits[row, len(ids) - n:len(ids)].float(), -1).cpu().numpy()
                   for row, (ids, n) in enumerate(zip(prompts, scored))]


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
