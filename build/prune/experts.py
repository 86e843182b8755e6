"""Expert lists from routing statistics (SPEC section 7): pure functions, parameters from a TOML config.

    python -m build.prune.experts --stats stats.npz --config build/lists.toml --out DIR

- REAP-k: the k experts of highest REAP saliency in each layer (the same k everywhere: the config has one count).
- ARC-k: the k experts of highest routing frequency F_e: per length bin, each trace's share of routing decisions
  averaged over the traces with tokens in that bin; bins weighted towards long thinking.
- s288p: REAP-base, then in each layer up to `max_swaps` of its least-used experts (used <= `low_use` x the layer's
  mean count, and not a specialist: > `specialist_share` of the decisions of some trace and bin with at least
  `specialist_min_tokens` tokens) exchanged for the REAP-wide experts outside it with the highest F_e.
- c8: s288p plus `extra` experts per layer that program tokens prefer: among the top-`extra` program-share experts
  outside the list in >= `stability` of `half_samples` task-level half samples, significant in a within-task
  permutation test (task-level sign flips of program share minus other share) at `alpha`, with a program share of at
  least `min_ratio` x the uniform share; layers with fewer are filled by F_e. Every layer ends with the same count.
Each list is a tuple of sorted expert indices per layer. `report` gives, per list, the count per layer, the Jaccard
overlap with the other lists, and the share of ARC routing decisions dropped against random cuts of the same size.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from build.prune.stats import BINS, RoutingStats
from submission import strict_toml

ExpertList = tuple[tuple[int, ...], ...]


@dataclass(frozen=True)
class ListConfig:
    reap_k: int = 288
    wide_k: int = 384
    max_swaps: int = 16
    low_use: float = 0.06
    specialist_share: float = 0.05
    specialist_min_tokens: int = 256
    extra: int = 8
    half_samples: int = 40
    stability: float = 0.9
    alpha: float = 0.05
    permutations: int = 2000
    min_ratio: float = 1.5
    bin_weights: tuple[float, ...] = (0.05, 0.10, 0.13, 0.16, 0.19, 0.15, 0.12, 0.10)
    seed: int = 0

    def __post_init__(self) -> None:
        if len(self.bin_weights) != len(BINS):
            raise ValueError(f"bin_weights needs {len(BINS)} values ({', '.join(BINS)})")
        if not 0 < self.reap_k <= self.wide_k:
            raise ValueError("need 0 < reap_k <= wide_k")


def load_config(path: str | Path) -> ListConfig:
    """The list parameters of a TOML file (submission.strict_toml): a missing file, invalid TOML, an unknown key or a
    value of the wrong type raise TomlError naming the file and the key."""
    return strict_toml.build(ListConfig, strict_toml.read(path), str(path))


def _top(scores: np.ndarray, k: int, exclude: set[int] = frozenset()) -> list[int]:
    """Indices of the k highest scores (ties to the lower index), skipping `exclude`."""
    order = sorted(range(len(scores)), key=lambda e: (-scores[e], e))
    return [e for e in order if e not in exclude][:k]


def reap_list(stats: RoutingStats, k: int) -> ExpertList:
    saliency = stats.saliency()
    return tuple(tuple(sorted(_top(saliency[layer], k))) for layer in range(stats.layers))


def frequency(stats: RoutingStats, bin_weights: tuple[float, ...]) -> np.ndarray:
    """F_e per layer and expert: bin-weighted mean over traces of the share of routing decisions."""
    decisions = stats.tokens[:, :, None, None] * stats.top_k
    share = np.divide(stats.counts, decisions, out=np.zeros(stats.counts.shape), where=decisions > 0)
    present = stats.tokens > 0  # [T, B]
    per_bin = share.sum(0) / np.maximum(present.sum(0), 1)[:, None, None]  # [B, L, E]
    weights = np.array(bin_weights) * (present.sum(0) > 0)
    return np.tensordot(weights / weights.sum(), per_bin, axes=1)


def arc_list(stats: RoutingStats, k: int, bin_weights: tuple[float, ...]) -> ExpertList:
    f = frequency(stats, bin_weights)
    return tuple(tuple(sorted(_top(f[layer], k))) for layer in range(stats.layers))


def specialists(stats: RoutingStats, share: float, min_tokens: int) -> np.ndarray:
    """[L, E] True where the expert takes more than `share` of the decisions of some trace and bin with enough
    tokens."""
    decisions = stats.tokens[:, :, None, None] * stats.top_k
    enough = (stats.tokens >= min_tokens)[:, :, None, None]
    shares = np.divide(stats.counts, decisions, out=np.zeros(stats.counts.shape), where=decisions > 0)
    return ((shares > share) & enough).any(axis=(0, 1))


def s288p_list(stats: RoutingStats, config: ListConfig) -> ExpertList:
    base, wide = reap_list(stats, config.reap_k), reap_list(stats, config.wide_k)
    f = frequency(stats, config.bin_weights)
    used = stats.counts.sum(axis=(0, 1))  # [L, E]
    special = specialists(stats, config.specialist_share, config.specialist_min_tokens)
    out = []
    for layer in range(stats.layers):
        kept = set(base[layer])
        threshold = config.low_use * used[layer].mean()
        removable = sorted((e for e in kept if used[layer, e] <= threshold and not special[layer, e]),
                           key=lambda e: (used[layer, e], e))
        incoming = _top(f[layer], config.max_swaps, exclude=kept | (set(range(stats.experts)) - set(wide[layer])))
        swaps = min(config.max_swaps, len(removable), len(incoming))
        kept = (kept - set(removable[:swaps])) | set(incoming[:swaps])
        out.append(tuple(sorted(kept)))
    return tuple(out)


def _program_share(stats: RoutingStats, traces: np.ndarray) -> np.ndarray:
    decisions = stats.program_tokens[traces].sum() * stats.top_k
    return stats.program_counts[traces].sum(0) / max(decisions, 1)


def _sign_flip_p(differences: np.ndarray, permutations: int, rng: np.random.Generator) -> np.ndarray:
    """One-sided p-values, per expert, that the mean over tasks of `differences` [tasks, E] exceeds 0 by chance."""
    observed = differences.mean(0)
    signs = rng.choice([-1.0, 1.0], size=(permutations, differences.shape[0]))
    null = signs @ differences / differences.shape[0]  # [permutations, E]
    return ((null >= observed).sum(0) + 1) / (permutations + 1)


def code_list(stats: RoutingStats, config: ListConfig, base: ExpertList) -> ExpertList:
    """c8: `base` (s288p) plus the program-preferred experts of each layer, filled by F_e (see the module doc)."""
    rng = np.random.default_rng(config.seed)
    f = frequency(stats, config.bin_weights)
    tasks = sorted(set(stats.task_ids))
    by_task = {t: np.array([i for i, x in enumerate(stats.task_ids) if x == t]) for t in tasks}
    with_program = [t for t in tasks if stats.program_tokens[by_task[t]].sum() > 0]
    uniform = 1.0 / stats.experts
    out = []
    for layer in range(stats.layers):
        kept = set(base[layer])
        chosen: list[int] = []
        if len(with_program) >= 2:
            hits = np.zeros(stats.experts)
            for _ in range(config.half_samples):
                half = rng.choice(len(with_program), size=len(with_program) // 2, replace=False)
                traces = np.concatenate([by_task[with_program[i]] for i in half])
                for e in _top(_program_share(stats, traces)[layer], config.extra, exclude=kept):
                    hits[e] += 1
            stable = hits / config.half_samples >= config.stability
            differences = []
            for t in with_program:
                idx = by_task[t]
                prog = stats.program_counts[idx, layer].sum(0)
                prog_decisions = max(stats.program_tokens[idx].sum() * stats.top_k, 1)
                total = stats.counts[idx, :, layer].sum(axis=(0, 1))
                other = total - prog
                other_decisions = max(stats.tokens[idx].sum() * stats.top_k - prog_decisions, 1)
                differences.append(prog / prog_decisions - other / other_decisions)
            p = _sign_flip_p(np.array(differences), config.permutations, rng)
            share = _program_share(stats, np.concatenate([by_task[t] for t in with_program]))[layer]
            qualified = [e for e in range(stats.experts) if e not in kept and stable[e] and p[e] < config.alpha
                         and share[e] >= config.min_ratio * uniform]
            chosen = sorted(qualified, key=lambda e: (-share[e], e))[:config.extra]
        fill = _top(f[layer], config.extra - len(chosen), exclude=kept | set(chosen))
        out.append(tuple(sorted(kept | set(chosen) | set(fill))))
    return tuple(out)


def build_lists(stats: RoutingStats, config: ListConfig) -> dict[str, ExpertList]:
    s288p = s288p_list(stats, config)
    return {f"reap{config.reap_k}": reap_list(stats, config.reap_k),
            f"arc{config.reap_k}": arc_list(stats, config.reap_k, config.bin_weights),
            f"s{config.reap_k}p": s288p,
            f"c{config.extra}": code_list(stats, config, s288p)}


def jaccard(a: ExpertList, b: ExpertList) -> float:
    return float(np.mean([len(set(x) & set(y)) / len(set(x) | set(y)) for x, y in zip(a, b)]))


def dropped_share(stats: RoutingStats, kept: ExpertList, random_cuts: int = 200, seed: int = 0) -> tuple[float, float]:
    """Share of all ARC routing decisions that go to dropped experts, and the same for random cuts of equal size."""
    used = stats.counts.sum(axis=(0, 1))
    total = used.sum()
    dropped = sum(used[layer].sum() - used[layer, list(k)].sum() for layer, k in enumerate(kept))
    rng = np.random.default_rng(seed)
    random = []
    for _ in range(random_cuts):
        random.append(sum(used[layer].sum() - used[layer, rng.choice(stats.experts, len(k), replace=False)].sum()
                          for layer, k in enumerate(kept)))
    return float(dropped / total), float(np.mean(random) / total)


def report(stats: RoutingStats, lists: dict[str, ExpertList]) -> dict:
    out = {}
    for name, kept in lists.items():
        mine, rand = dropped_share(stats, kept)
        out[name] = {"experts_per_layer": sorted({len(layer) for layer in kept}),
                     "jaccard": {other: round(jaccard(kept, b), 4) for other, b in lists.items() if other != name},
                     "dropped_decision_share": round(mine, 4), "random_cut_dropped_share": round(rand, 4)}
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m build.prune.experts", description=__doc__.split("\n\n")[0])
    parser.add_argument("--stats", required=True, type=Path)
    parser.add_argument("--config", type=Path, help="list parameters (TOML); defaults: SPEC section 7")
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args(argv)
    stats = RoutingStats.load(args.stats)
    config = load_config(args.config) if args.config else ListConfig()
    lists = build_lists(stats, config)
    args.out.mkdir(parents=True, exist_ok=True)
    for name, kept in lists.items():
        (args.out / f"{name}.json").write_text(json.dumps(
            {"name": name, "config_hash": stats.config_hash, "parameters": config.__dict__ | {},
             "experts": [list(layer) for layer in kept]}))
    summary = report(stats, lists)
    (args.out / "report.json").write_text(json.dumps(summary, indent=1))
    for name, row in summary.items():
        print(f"{name:10s} experts/layer {row['experts_per_layer']}  dropped decisions "
              f"{100 * row['dropped_decision_share']:.2f}% (random cut {100 * row['random_cut_dropped_share']:.2f}%)"
              f"  jaccard {row['jaccard']}")


if __name__ == "__main__":
    main()
