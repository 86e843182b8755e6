"""The forecast as a person reads it (text, a timeline PNG of one representative run, a PNG of the forecast's
distribution) and as a script reads it (`report_json`, the whole report as one JSON-ready dict)."""

from __future__ import annotations

import statistics
from pathlib import Path

from sim.forecast import Forecast, Sensitivity, percentile
from sim.run import SimResult
from sim.serving import Sample


def summary(forecast: Forecast, truth: dict) -> dict:
    """Means over the runs of everything the reports show."""
    f = forecast
    runs = len(f.results)
    by_level: dict[str, float] = {}
    tokens: dict[str, float] = {}
    for r in f.results:
        for level, count in r.by_level().items():
            by_level[level] = by_level.get(level, 0) + count / runs
        for kind, count in r.tokens_by_outcome(truth).items():
            tokens[kind] = tokens.get(kind, 0) + count / runs
    waits = [w for r in f.results for w in r.engine_waits]
    return {
        "runs": runs, "tasks": len(f.results[0].task_scores), "test_inputs": len(truth),
        "score": f.score, "runs_interval_90": list(f.runs_interval), "tasks_interval_90": list(f.tasks_interval),
        "scores": [r.score for r in f.results],
        "unanswered": f.mean(lambda r: r.unanswered),
        "unanswered_per_run": [r.unanswered for r in f.results],
        "attempts_by_level": dict(sorted(by_level.items())),
        "tokens_by_outcome": dict(sorted(tokens.items())),
        "aborted_at_hard_stop": f.mean(lambda r: len(r.aborted)),
        "skipped_cap_too_small": f.mean(lambda r: r.skipped),
        "never_started": f.mean(lambda r: r.never_started),
        "preemptions": f.mean(lambda r: r.preemptions),
        "engine_wait_s_mean": statistics.fmean(waits) if waits else 0.0,
        "engine_wait_s_p95": percentile(waits, 0.95) if waits else 0.0,
        "minutes_left_at_end": f.mean(lambda r: max(r.hard_stop_s - r.end_s, 0)) / 60,
    }


def text_report(name: str, forecast: Forecast, truth: dict, sensitivity: list[Sensitivity] | None = None) -> str:
    s = summary(forecast, truth)
    levels = s["attempts_by_level"]
    lines = [
        f"forecast for {name}: {s['runs']} simulated runs, {s['tasks']} tasks, {s['test_inputs']} test inputs",
        f"  task-weighted score   {s['score']:6.2f}",
        f"  90% interval, runs    {s['runs_interval_90'][0]:6.2f} .. {s['runs_interval_90'][1]:.2f}  (attempts, and "
        f"throughput noise if set)",
        f"  90% interval, tasks   {s['tasks_interval_90'][0]:6.2f} .. {s['tasks_interval_90'][1]:.2f}  (bootstrap over "
        f"tasks)",
        f"  unanswered inputs     {s['unanswered']:6.1f} of {s['test_inputs']}",
        f"  first attempts ran    {levels.get('FIRST', 0):6.1f}, second attempts ran {levels.get('SECOND', 0):.1f}",
        "  attempts by level     " + ", ".join(f"{k} {v:.1f}" for k, v in levels.items()),
        "  tokens by outcome     " + ", ".join(f"{k} {v / 1e6:.2f}M" for k, v in s["tokens_by_outcome"].items()),
        f"  aborted at hard stop  {s['aborted_at_hard_stop']:6.1f}; skipped (cap too small) "
        f"{s['skipped_cap_too_small']:.1f}; never started (queued at the stop) {s['never_started']:.1f}",
        f"  waiting in the engine {s['engine_wait_s_mean'] / 60:6.1f} min per request on average, 95th percentile "
        f"{s['engine_wait_s_p95'] / 60:.1f} min (handed over with their cap fixed, not yet running)",
        f"  preemptions           {s['preemptions']:6.1f} per run (KV cache full: the newest request recomputes)",
        f"  time left at the end  {s['minutes_left_at_end']:6.1f} min before the hard stop",
    ]
    for item in sensitivity or ():
        lines.append(f"  sensitivity           {item.per_percent:+.3f} +- {item.standard_error:.3f} points per +1% "
                     f"{item.resource.replace('_', ' ')} ({item.pairs} pairs at +{100 * item.step:g}%)")
    return "\n".join(lines)


def sweep_table(rows: list[tuple[str, Forecast, dict]]) -> str:
    """One line per variant: score, interval, unanswered inputs, preemptions, engine wait."""
    out = [f"{'variant':28s} {'score':>7s} {'90% (runs)':>17s} {'unanswered':>11s} {'preempt':>8s} {'wait min':>9s}"]
    for name, f, s in rows:
        out.append(f"{name:28s} {f.score:7.2f} {f.runs_interval[0]:8.2f}..{f.runs_interval[1]:<7.2f} "
                   f"{s['unanswered']:11.1f} {s['preemptions']:8.1f} {s['engine_wait_s_mean'] / 60:9.1f}")
    return "\n".join(out)


def report_json(scenario: dict, assumptions: list[str], forecast: dict, sensitivity: list[Sensitivity] | None,
                sweep: list[tuple[str, dict]]) -> dict:
    return {"scenario": scenario, "assumptions": assumptions, "forecast": forecast,
            "sensitivity": [{"resource": s.resource, "points_per_percent": s.per_percent,
                             "standard_error": s.standard_error, "step": s.step, "pairs": s.pairs}
                            for s in sensitivity or ()],
            "sweep": [{"variant": name} | summary for name, summary in sweep]}


def timeline_png(result: SimResult, timeline: list[Sample], preempted: list[tuple[float, tuple, int]], blocks: int,
                 path: str | Path, title: str) -> Path:
    """Running and queued requests, KV blocks used and free with the preemptions, tokens/s, answered inputs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(4, 1, figsize=(9, 9), sharex=True)
    hours = [s.time / 3600 for s in timeline]
    axes[0].step(hours, [s.running for s in timeline], where="post", label="running")
    axes[0].step(hours, [s.waiting for s in timeline], where="post", color="tab:gray", label="queued in the engine")
    axes[0].set_ylabel("requests")
    axes[0].legend(loc="upper right", fontsize=8)
    axes[1].step(hours, [s.blocks_used for s in timeline], where="post", color="tab:purple", label="used")
    axes[1].step(hours, [blocks - s.blocks_used for s in timeline], where="post", color="tab:olive", label="free")
    if preempted:
        axes[1].plot([t / 3600 for t, _, _ in preempted], [blocks] * len(preempted), "v", color="tab:red",
                     markersize=4, label=f"preemption ({len(preempted)})")
    axes[1].set_ylabel("KV blocks")
    axes[1].legend(loc="upper right", fontsize=8)
    axes[2].step(hours, [s.tokens_per_s for s in timeline], where="post", color="tab:orange")
    axes[2].set_ylabel("tokens / s")
    axes[3].plot([t / 3600 for t, _ in result.answered_curve], [n for _, n in result.answered_curve],
                 color="tab:green")
    axes[3].set_ylabel("answered inputs")
    axes[3].set_xlabel("hours")
    for number, ax in enumerate(axes):
        ax.axvline(result.hard_stop_s / 3600, color="red", linestyle="--", linewidth=0.8,
                   label="hard stop" if number in (0, 3) else None)
        ax.set_ylim(bottom=0)  # counts and rates start at zero, or small changes look large
        ax.grid(alpha=0.3)
    axes[0].legend(loc="upper right", fontsize=8)
    axes[3].legend(loc="lower right", fontsize=8)
    axes[0].set_title(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def distribution_png(summary: dict, path: str | Path, title: str) -> Path:
    """The forecast over all runs: the score histogram with its mean and 90% interval, and unanswered inputs."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 3.8))
    axes[0].hist(summary["scores"], bins=min(30, max(5, len(summary["scores"]) // 2)), color="tab:blue", alpha=0.8)
    axes[0].axvline(summary["score"], color="black", label=f"mean {summary['score']:.2f}")
    for number, edge in enumerate(summary["runs_interval_90"]):
        axes[0].axvline(edge, color="black", linestyle=":", label="runs 90%" if number == 0 else None)
    low, high = summary["tasks_interval_90"]
    axes[0].axvspan(low, high, color="tab:orange", alpha=0.15, label=f"tasks 90% {low:.1f}..{high:.1f}")
    axes[0].set_xlabel("task-weighted score")
    axes[0].set_ylabel("runs")
    axes[0].legend(fontsize=8)
    axes[1].hist(summary["unanswered_per_run"], bins=20, color="tab:red", alpha=0.8)
    axes[1].set_xlabel("unanswered test inputs")
    axes[1].set_ylabel("runs")
    fig.suptitle(title)
    fig.tight_layout()
    path = Path(path)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path
