"""Routing statistics of a mixture-of-experts model on calibration traces: the container, its file, and merging.

Recorded by `build.prune.calibrate` (forward hooks, one trace at a time) and read by `build.prune.experts`. Every array
holds sums or counts, so runs split over machines merge by adding (saliency, program counts) and concatenating
(per-trace arrays); a merge refuses statistics of a different model (config hash) or layout.

Per layer L and expert E (T traces, B length bins: prompt, six 16K-token thinking bins, answer):
    counts[T, B, L, E]        routing decisions (each token makes top_k of them)
    tokens[T, B]              tokens per trace and bin
    program_counts[T, L, E]   routing decisions on program tokens
    program_tokens[T]
    saliency_sum[L, E]        sum over routed tokens of gate value x L2 norm of the expert output (REAP)
    saliency_n[L, E]          routed tokens
    mtp_router_norms[M, E]    row norms of the MTP layer's router(s) (M = 0 when the model has none)
    task_ids[T]               the ARC task of each trace (half samples and permutation tests are by task)
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

BINS = ("prompt", "think_0_16k", "think_16_32k", "think_32_48k", "think_48_64k", "think_64_80k", "think_80_96k",
        "answer")
THINK_BIN_TOKENS = 16_384


def bin_of(segment: str, position_in_thinking: int) -> int:
    """The length bin of a token: its segment, and for thinking its position (the last bin takes everything beyond)."""
    if segment == "prompt":
        return 0
    if segment == "thinking":
        return 1 + min(position_in_thinking // THINK_BIN_TOKENS, 5)
    return len(BINS) - 1  # answer and program tokens


def config_hash(config: dict) -> str:
    """A stable hash of a model's config.json (expert counts and shapes decide whether statistics match)."""
    return hashlib.sha256(json.dumps(config, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class RoutingStats:
    config_hash: str
    top_k: int
    counts: np.ndarray
    tokens: np.ndarray
    program_counts: np.ndarray
    program_tokens: np.ndarray
    saliency_sum: np.ndarray
    saliency_n: np.ndarray
    mtp_router_norms: np.ndarray
    task_ids: list[str]

    @property
    def layers(self) -> int:
        return self.saliency_sum.shape[0]

    @property
    def experts(self) -> int:
        return self.saliency_sum.shape[1]

    def saliency(self) -> np.ndarray:
        """REAP saliency per layer and expert: mean over routed tokens of gate x ||expert output|| (0 if never routed)."""
        return np.divide(self.saliency_sum, self.saliency_n, out=np.zeros_like(self.saliency_sum),
                         where=self.saliency_n > 0)

    def check(self) -> None:
        t, b, l, e = self.counts.shape
        shapes = {"tokens": (t, b), "program_counts": (t, l, e), "program_tokens": (t,), "saliency_sum": (l, e),
                  "saliency_n": (l, e)}
        for name, shape in shapes.items():
            if getattr(self, name).shape != shape:
                raise ValueError(f"routing stats: {name} has shape {getattr(self, name).shape}, expected {shape}")
        if b != len(BINS) or len(self.task_ids) != t:
            raise ValueError(f"routing stats: {b} bins (expected {len(BINS)}), {len(self.task_ids)} task ids for "
                             f"{t} traces")

    def merge(self, other: RoutingStats) -> RoutingStats:
        if (other.config_hash, other.top_k) != (self.config_hash, self.top_k):
            raise ValueError(f"cannot merge statistics of model {other.config_hash} (top_k {other.top_k}) into "
                             f"{self.config_hash} (top_k {self.top_k})")
        return RoutingStats(
            self.config_hash, self.top_k, np.concatenate([self.counts, other.counts]),
            np.concatenate([self.tokens, other.tokens]), np.concatenate([self.program_counts, other.program_counts]),
            np.concatenate([self.program_tokens, other.program_tokens]), self.saliency_sum + other.saliency_sum,
            self.saliency_n + other.saliency_n,
            self.mtp_router_norms if self.mtp_router_norms.size else other.mtp_router_norms,
            self.task_ids + other.task_ids)

    def save(self, path: str | Path) -> None:
        path = Path(path)
        arrays = {name: getattr(self, name) for name in ("counts", "tokens", "program_counts", "program_tokens",
                                                         "saliency_sum", "saliency_n", "mtp_router_norms")}
        meta = {"config_hash": self.config_hash, "top_k": self.top_k, "task_ids": self.task_ids, "bins": BINS}
        tmp = path.with_name(path.name + ".tmp.npz")
        np.savez_compressed(tmp, meta=np.array(json.dumps(meta)), **arrays)
        tmp.replace(path)

    @classmethod
    def load(cls, path: str | Path) -> RoutingStats:
        path = Path(path)
        try:
            with np.load(path, allow_pickle=False) as data:
                meta = json.loads(str(data["meta"]))
                stats = cls(meta["config_hash"], int(meta["top_k"]), data["counts"], data["tokens"],
                            data["program_counts"], data["program_tokens"], data["saliency_sum"], data["saliency_n"],
                            data["mtp_router_norms"], list(meta["task_ids"]))
        except (OSError, KeyError, ValueError) as err:
            raise ValueError(f"{path}: not routing statistics: {err}") from None
        stats.check()
        return stats
