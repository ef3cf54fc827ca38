"""The HTML report of a tuning study: every trial with its parameters, parts and worker."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from matplotlib.figure import Figure

from dynshape_perception.fsutil import atomic_write_text
from dynshape_perception.tools.replay.report import COLORS, STYLE, WIDTH_IN, html_grid, png_base64

PARTS = ("miss_rate", "latency_p95_ms", "prediction_error_m", "frames")


def plot_trials(trials: list[optuna.trial.FrozenTrial]) -> Figure:
    """Each completed trial's objective by trial number, and the best so far."""
    fig = Figure(figsize=(WIDTH_IN, 3.2))
    ax = fig.subplots()
    done = [t for t in trials if t.value is not None]
    if not done:
        ax.text(0.5, 0.5, "no completed trial", ha="center", va="center", transform=ax.transAxes)
        return fig
    numbers = [t.number for t in done]
    values = np.array([t.value for t in done], dtype=float)
    drivers = sorted({str(t.user_attrs.get("driver", "")) for t in done})
    for i, driver in enumerate(drivers):
        picked = [j for j, t in enumerate(done) if str(t.user_attrs.get("driver", "")) == driver]
        ax.plot(
            [numbers[j] for j in picked],
            values[picked],
            "o",
            color=COLORS[i % len(COLORS)],
            label=f"trials of {driver or 'this process'}",
        )
    ax.step(numbers, np.minimum.accumulate(values), where="post", color="black", label="best")
    ax.set_xlabel("trial")
    ax.set_ylabel("objective")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return "" if value is None else str(value)


def render_trials(study: optuna.Study) -> str:
    trials = study.get_trials(deepcopy=False)
    names = sorted({n for t in trials for n in t.params})
    rows = [
        [
            t.number,
            t.state.name.lower(),
            _fmt(t.value),
            *(_fmt(t.params.get(n)) for n in names),
            *(_fmt(t.user_attrs.get(p)) for p in PARTS),
            _fmt(t.user_attrs.get("driver")),
            _fmt(t.user_attrs.get("worker")),
        ]
        for t in trials
    ]
    head = ["trial", "state", "objective", *names, *PARTS, "tune process", "worker"]
    complete = [t for t in trials if t.value is not None]
    best = min(complete, key=lambda t: t.value or 0.0) if complete else None
    title = f"Tuning study {study.study_name}"
    summary = f"{len(trials)} trials, {len(complete)} complete" + (
        f"; best: trial {best.number}, objective {best.value:.5g}" if best else ""
    )
    plot = png_base64(plot_trials(trials))
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1><p>{html.escape(summary)}</p>"
        f'<img alt="objective by trial" src="data:image/png;base64,{plot}">'
        f"<h2>Trials</h2>{html_grid(head, rows)}</body></html>"
    )


def write_trials_report(study: optuna.Study, out: Path) -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, render_trials(study))
    out.chmod(0o644)
    return out
