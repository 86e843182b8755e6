"""The kit's own small tokenizer for tiny checkpoints (build.models.tiny, build.models.topology): Qwen's special tokens
and a Qwen3-style chat template whose generation prompt opens thinking, over a byte-level BPE trained on a built-in
corpus.

The real special tokens (<|im_start|>, <|im_end|>, <think>, </think>, <|endoftext|>) let every model path run on
tiny checkpoints; digits are split one per token as in Qwen's tokenizer. Its own module because both kinds of tiny
checkpoint (build.models.tiny's architectures and build.models.topology's full topologies) are written with it.
"""

from __future__ import annotations

from pathlib import Path

SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<think>", "</think>"]

CHAT_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message.role + '\\n' }}"
    "{%- if message.role == 'assistant' and message.reasoning_content is defined %}"
    "{{- '<think>\\n' + message.reasoning_content + '\\n</think>\\n\\n' }}"
    "{%- endif %}"
    "{{- message.content + '<|im_end|>\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}"
    "{{- '<|im_start|>assistant\\n' }}"
    "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\\n\\n</think>\\n\\n' }}"
    "{%- else %}{{- '<think>\\n' }}{%- endif %}"
    "{%- endif %}"
)

_CORPUS = """Find the common rule that maps each input grid to its output grid in the examples, then apply it to the
test input. Answer with the output grid, one row per line, digits separated by spaces.
Example Input Output Test input. Let me look at the grids. The rule seems to be: each cell becomes the colour of its
neighbour, the object is moved, mirrored, rotated or copied. Considering the limited time by the user, I have to give
the solution based on the thinking directly now. The transformation as a self-contained Python function:
```python
def transform(grid):
    import numpy as np
    a = np.array(grid)
    h, w = a.shape
    out = [[0] * w for _ in range(h)]
    for r in range(h):
        for c in range(w):
            if grid[r][c] != 0:
                out[r][c] = grid[r][c]
    return out
```
"""


def _corpus() -> list[str]:
    rows = [" ".join(str((i * 7 + j * 3) % 10) for j in range(1 + i % 30)) for i in range(300)]
    return [_CORPUS] * 20 + rows + [f"{h}x{w}" for h in range(1, 31) for w in range(1, 31)]


def make_tokenizer(out: Path, vocab_size: int = 1024):
    """Train the tokenizer (deterministic: same corpus, same merges), save it to `out` and return it."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(), trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   additional_special_tokens=["<|im_start|>", "<think>", "</think>"])
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast
