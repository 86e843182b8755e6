"""The forecast as a person reads it: a text report and a PNG timeline of one representative run."""

from __future__ import annotations

from pathlib import Path

from sim.forecast import Forecast
from sim.run import SimResult


def text_report(name: str, forecast: Forecast, truth: dict, sensitivity: dict[str, float] | None = None) -> str:
    f = forecast
    first = f.mean(lambda r: sum(1 for q, _, _, _ in r.finished if q.level.name == "FIRST"))
    second = f.mean(lambda r: sum(1 for q, _, _, _ in r.finished if q.level.name == "SECOND"))
    by_level: dict[str, float] = {}
    tokens: dict[str, float] = {}
    for r in f.results:
        for level, count in r.by_level().items():
            by_level[level] = by_level.get(level, 0) + count / len(f.results)
        for kind, count in r.tokens_by_outcome(truth).items():
            tokens[kind] = tokens.get(kind, 0) + count / len(f.results)
    n_inputs = len(truth)
    lines = [
        f"forecast for {name}: {len(f.results)} simulated runs, {len(f.results[0].task_scores)} tasks, "
        f"{n_inputs} test inputs",
        f"  task-weighted score   {f.score:6.2f}",
        f"  90% interval, runs    {f.runs_interval[0]:6.2f} .. {f.runs_interval[1]:.2f}  (attempts and throughput)",
        f"  90% interval, tasks   {f.tasks_interval[0]:6.2f} .. {f.tasks_interval[1]:.2f}  (bootstrap over tasks)",
        f"  unanswered inputs     {f.mean(lambda r: r.unanswered):6.1f} of {n_inputs}",
        f"  first attempts ran    {first:6.1f}, second attempts ran {second:.1f}",
        "  attempts by level     " + ", ".join(f"{k} {v:.1f}" for k, v in sorted(by_level.items())),
        "  tokens by outcome     " + ", ".join(f"{k} {v / 1e6:.2f}M" for k, v in sorted(tokens.items())),
        f"  aborted at hard stop  {f.mean(lambda r: len(r.aborted)):6.1f}; skipped (cap too small) "
        f"{f.mean(lambda r: r.skipped):.1f}",
        f"  time left at the end  {f.mean(lambda r: max(r.hard_stop_s - r.end_s, 0)) / 60:6.1f} min before the hard stop",
    ]
    if sensitivity:
        lines.append(f"  sensitivity           {sensitivity['throughput']:+.3f} points per +1% throughput, "
                     f"{sensitivity['kv_cache']:+.3f} per +1% KV cache")
    return "\n".join(lines)


def sweep_table(rows: list[tuple[str, Forecast, int]]) -> str:
    """One line per profile: score, interval, unanswered inputs."""
    out = [f"{'profile':28s} {'score':>7s} {'90% (runs)':>17s} {'unanswered':>11s}"]
    for name, f, _ in rows:
        out.append(f"{name:28s} {f.score:7.2f} {f.runs_interval[0]:8.2f}..{f.runs_interval[1]:<7.2f} "
                   f"{f.mean(lambda r: r.unanswered):11.1f}")
    return "\n".join(out)


def timeline_png(result: SimResult, timeline: list[tuple[float, int, float]], path: str | Path, title: str) -> Path:
    """Running requests, tokens/s and cumulative answered inputs over the run."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(3, 1, figsize=(9, 7), sharex=True)
    hours = [t / 3600 for t, _, _ in timeline]
    axes[0].step(hours, [n for _, n, _ in timeline], where="post")
    axes[0].set_ylabel("running requests")
    axes[1].step(hours, [rate for _, _, rate in timeline], where="post", color="tab:orange")
    axes[1].set_ylabel("tokens / s")
    axes[2].plot([t / 3600 for t, _ in result.answered_curve], [n for _, n in result.answered_curve],
                 color="tab:green")
    axes[2].set_ylabel("answered inputs")
    axes[2].set_xlabel("hours")
    for ax in axes:
        ax.axvline(result.hard_stop_s / 3600, color="red", linestyle="--", linewidth=0.8)
        ax.grid(alpha=0.3)
    axes[0].set_title(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
