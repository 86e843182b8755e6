"""Expert lists on routing statistics built so that the right answer is known, and the adoption rule."""

from __future__ import annotations

import numpy as np
import pytest

from build.prune.adoption import adoption
from build.prune.experts import ListConfig, arc_list, build_lists, code_list, dropped_share, frequency, load_config, \
    reap_list, report, s288p_list
from build.prune.stats import BINS, RoutingStats, bin_of
from submission.strict_toml import TomlError

L, E, TOP_K = 2, 32, 2


def make_stats(traces: int = 12, seed: int = 0, program_bias: tuple[int, ...] = ()) -> RoutingStats:
    """Random routing with saliency increasing in the expert index (so REAP keeps the top indices), expert 0 used
    heavily everywhere, and program tokens that prefer the experts in `program_bias`."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(300, 2000, size=(traces, len(BINS)))
    weights = np.ones(E)
    weights[0] = 20.0
    counts = np.zeros((traces, len(BINS), L, E))
    program_counts = np.zeros((traces, L, E))
    program_tokens = rng.integers(200, 500, size=traces)
    for t in range(traces):
        for b in range(len(BINS)):
            for layer in range(L):
                counts[t, b, layer] = rng.multinomial(tokens[t, b] * TOP_K, weights / weights.sum())
        bias = np.ones(E)
        bias[list(program_bias)] = 12.0
        for layer in range(L):
            program_counts[t, layer] = rng.multinomial(program_tokens[t] * TOP_K, bias / bias.sum())
        counts[t, -1] += program_counts[t]  # program tokens are answer-bin tokens too
        tokens[t, -1] += program_tokens[t]
    saliency_n = counts.sum(axis=(0, 1))
    saliency_sum = saliency_n * (np.arange(E) + 1.0)[None, :]
    return RoutingStats("abc", TOP_K, counts, tokens, program_counts, program_tokens, saliency_sum, saliency_n,
                        np.zeros((0, E)), [f"task{t // 2}" for t in range(traces)])


def test_bins():
    assert bin_of("prompt", 0) == 0 and bin_of("thinking", 0) == 1 and bin_of("thinking", 40_000) == 3
    assert bin_of("thinking", 10**6) == 6 and bin_of("answer", 0) == 7


def test_reap_keeps_the_most_salient():
    stats = make_stats()
    assert reap_list(stats, 8) == (tuple(range(24, 32)),) * L


def test_arc_keeps_the_most_used():
    stats = make_stats()
    kept = arc_list(stats, 4, ListConfig().bin_weights)
    assert all(0 in layer and len(layer) == 4 for layer in kept)
    f = frequency(stats, ListConfig().bin_weights)
    assert f.sum(axis=1) == pytest.approx(np.ones(L))  # shares of decisions sum to one per layer


def test_s288p_swaps_the_least_used_non_specialists_for_frequent_experts():
    stats = make_stats()
    # in layer 0, experts 30 and 31 (REAP's top) are almost never used; 31 dominates one trace-bin (a specialist)
    stats.counts[:, :, 0, 30] = 0
    stats.counts[:, :, 0, 31] = 0
    stats.counts[3, 2, 0, 31] = 0.5 * stats.tokens[3, 2] * TOP_K
    config = ListConfig(reap_k=8, wide_k=32, max_swaps=4, low_use=0.06)
    kept = s288p_list(stats, config)
    assert 30 not in kept[0] and 31 in kept[0] and 0 in kept[0]  # 30 out, the specialist stays, 0 comes in
    assert len(kept[0]) == len(kept[1]) == 8
    assert kept[1] == tuple(range(24, 32))  # nothing under the low-use line in layer 1


def test_code_experts_are_the_ones_program_tokens_prefer():
    stats = make_stats(traces=40, program_bias=(3, 5))
    config = ListConfig(reap_k=8, wide_k=12, extra=2, half_samples=20, permutations=500)
    base = s288p_list(stats, config)
    kept = code_list(stats, config, base)
    for layer in range(L):
        assert set(kept[layer]) == set(base[layer]) | {3, 5}


def test_without_a_program_preference_code_experts_are_filled_by_frequency():
    stats = make_stats(traces=40)
    config = ListConfig(reap_k=8, wide_k=12, extra=2, half_samples=20, permutations=500)
    base = s288p_list(stats, config)
    kept = code_list(stats, config, base)
    assert all(len(layer) == 10 and 0 in layer for layer in kept)


def test_lists_and_report(tmp_path):
    stats = make_stats(traces=20, program_bias=(2,))
    config = ListConfig(reap_k=8, wide_k=16, max_swaps=4, extra=2, half_samples=10, permutations=200)
    lists = build_lists(stats, config)
    assert set(lists) == {"reap8", "arc8", "s8p", "c2"}
    rows = report(stats, lists)
    assert rows["c2"]["experts_per_layer"] == [10] and rows["reap8"]["experts_per_layer"] == [8]
    mine, random = dropped_share(stats, lists["arc8"])
    assert mine < random  # a frequency list drops fewer routing decisions than a random cut
    (tmp_path / "lists.toml").write_text("reap_k = 8\nwide_k = 16\n")
    assert load_config(tmp_path / "lists.toml").reap_k == 8
    (tmp_path / "bad.toml").write_text("reap_kk = 8\n")
    with pytest.raises(ValueError, match="unknown key"):
        load_config(tmp_path / "bad.toml")


def test_list_configs_are_read_strictly(tmp_path):
    """The shipped configs load; a missing file, a mistyped value or a bad setting names the file and the key."""
    assert load_config("build/lists.toml") == ListConfig()
    assert load_config("build/lists-tiny.toml").reap_k < ListConfig().reap_k
    with pytest.raises(TomlError, match=r"absent\.toml: cannot read"):
        load_config(tmp_path / "absent.toml")
    (tmp_path / "bad.toml").write_text('reap_k = "8"\n')
    with pytest.raises(TomlError, match=r"bad\.toml\.reap_k: expected int, got str"):
        load_config(tmp_path / "bad.toml")
    (tmp_path / "bad.toml").write_text("reap_k = 500\n")
    with pytest.raises(TomlError, match=r"bad\.toml: need 0 < reap_k <= wide_k"):
        load_config(tmp_path / "bad.toml")


def test_stats_save_load_merge(tmp_path):
    a, b = make_stats(traces=4, seed=1), make_stats(traces=6, seed=2)
    a.save(tmp_path / "a.npz")
    loaded = RoutingStats.load(tmp_path / "a.npz")
    assert np.array_equal(loaded.counts, a.counts) and loaded.task_ids == a.task_ids
    merged = loaded.merge(b)
    assert merged.counts.shape[0] == 10 and np.allclose(merged.saliency_n, a.saliency_n + b.saliency_n)
    other = make_stats(traces=2)
    other.config_hash = "different"
    with pytest.raises(ValueError, match="cannot merge"):
        merged.merge(other)


def test_adoption_rule():
    rng = np.random.default_rng(0)
    reference = {f"t{i}": float(rng.random() < 0.5) for i in range(120)}
    same = dict(reference)
    assert adoption(reference, same, 1.10).adopt
    assert not adoption(reference, same, 1.02).adopt  # not faster enough
    worse = {k: 0.0 if i % 10 == 0 else v for i, (k, v) in enumerate(reference.items())}
    verdict = adoption(reference, worse, 1.10)
    assert not verdict.adopt and verdict.lower_bound < -1
    with pytest.raises(ValueError, match="same tasks"):
        adoption(reference, {"x": 1.0}, 1.1)
