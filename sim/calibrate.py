"""Fit the serving model to an engine's own per-window statistics (the `<log>.stats.jsonl` a run writes).

Per window: tokens generated, mean running requests n, mean context tokens K, prompt tokens prefilled P, seconds.
Each decode step gives every running request one token, so the window ran S = tokens / n steps, and
    seconds = a*S + b*S*n + c*S*K + p*P
is linear in (a, b, c, p): a least-squares fit over the windows with work in them (coefficients kept >= 0 by refitting
without any that come out negative). The fit error is reported as the mean absolute relative error of the predicted
tokens per window. The startup is the start of the first window with tokens.

The windows also hold the engine's own counts (vLLM's drafts verified and accepted, preemptions;
submission.engine_numbers): the fit reports them beside the model. It does not use them: the step model gives every
running request one token a step, so a run with drafts fits a step that takes 1 / (1 + accepted drafts a step) of the
real one (`a`, `b`, `c` hold the acceptance, as the serving model's docstring says).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from sim.serving import ServingModel
from submission import engine_numbers, strict_toml


@dataclass(frozen=True)
class Fit:
    model: ServingModel
    windows: int
    token_error: float  # mean |predicted - actual| / actual tokens per window
    engine: engine_numbers.EngineNumbers  # what the engine measured of itself over the same windows (all of them)


def read_windows(path: str | Path) -> list[dict]:
    path = Path(path)
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if line.strip():
            try:
                rows.append(json.loads(line))
            except json.JSONDecodeError as err:
                raise ValueError(f"{path}:{number}: not JSON: {err}") from None
    return rows


def fit(windows: list[dict], kv_tokens: int, max_num_seqs: int) -> Fit:
    busy = [w for w in windows if w["tokens"] > 0 and w["running"] > 0]
    if len(busy) < 4:
        raise ValueError(f"need at least 4 windows with generated tokens to fit, got {len(busy)}")
    steps = np.array([w["tokens"] / w["running"] for w in busy])
    n = np.array([w["running"] for w in busy])
    k = np.array([w.get("context", 0.0) for w in busy])
    p = np.array([w.get("prompt_tokens", 0) for w in busy], dtype=float)
    seconds = np.array([w["seconds"] for w in busy])
    columns = {"a": steps, "b": steps * n, "c": steps * k, "p": p}
    active = [name for name, col in columns.items() if np.any(col)]
    while True:
        coef, *_ = np.linalg.lstsq(np.stack([columns[c] for c in active], 1), seconds, rcond=None)
        negative = [name for name, value in zip(active, coef) if value < 0]
        if not negative:
            break
        active = [name for name in active if name not in negative]
    values = dict.fromkeys("abcp", 0.0) | dict(zip(active, coef.tolist()))
    per_step = values["a"] + values["b"] * n + values["c"] * k
    predicted = np.where(per_step > 0, (seconds - values["p"] * p) / np.maximum(per_step, 1e-12) * n, 0.0)
    error = float(np.mean(np.abs(predicted - np.array([w["tokens"] for w in busy])) /
                          np.array([w["tokens"] for w in busy])))
    startup = min(w["start"] for w in busy)
    model = ServingModel(values["a"], values["b"], values["c"], values["p"], max(startup, 0.0), kv_tokens,
                         max_num_seqs)
    return Fit(model, len(busy), error, engine_numbers.from_windows(windows))


def to_toml(model: ServingModel, note: str) -> str:
    lines = [f"# {note}"] + [f"{k} = {strict_toml.value(v)}" for k, v in model.__dict__.items()]
    return "\n".join(lines) + "\n"
