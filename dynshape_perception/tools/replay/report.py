"""A self-contained HTML report of a replay run: matplotlib plots embedded as base64 PNG."""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from dynshape_perception.errors import ConfigError
from dynshape_perception.fsutil import atomic_write_text
from dynshape_perception.tools.replay.rundir import read_metrics

REPORT_FILE = "report.html"
DPI = 100
WIDTH_IN = 10.0
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b")
TIER_NAMES = {"1": "collision", "2": "planning", "3": "comfort", "4": "best effort"}
EVENT_STYLE = {"ok": ("o", "#2ca02c"), "failed": ("x", "#d62728"), "rejected": ("s", "#ff7f0e")}
COUNT_KEYS = ("obstacles", "tracks", "agents")


def png_base64(fig: Figure) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _frames(doc: dict[str, Any]) -> list[dict[str, Any]]:
    return [f for f in doc["frames"] if f.get("drop_reason") is None]


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="#555")
    ax.set_xticks([])
    ax.set_yticks([])


def plot_latency(doc: dict[str, Any]) -> Figure:
    """Per-frame latency of every stage, by tier, with the tier's deadline."""
    frames = _frames(doc)
    stages: Sequence[str] = doc["stages"]
    tiers = {t: spec for t, spec in doc["tiers"].items() if spec["stages"]}
    staged = {s for spec in tiers.values() for s in spec["stages"]}
    if not set(stages) <= staged:
        tiers = {"e2e": {"deadline_ms": None, "stages": list(stages)}}
    fig = Figure(figsize=(WIDTH_IN, 2.6 * len(tiers)))
    axes = fig.subplots(len(tiers), 1, squeeze=False)[:, 0]
    t = np.array([f["t_s"] for f in frames])
    for ax, (tier, spec) in zip(axes, tiers.items(), strict=True):
        drawn = False
        for i, stage in enumerate(spec["stages"]):
            values = np.array([f["latency_ms"].get(stage, np.nan) for f in frames], dtype=float)
            if np.isfinite(values).any():
                ax.plot(t, values, ".-", color=COLORS[i % len(COLORS)], label=f"{stage}")
                drawn = True
        done = np.array([f.get("completion_ms", {}).get(tier, np.nan) for f in frames], float)
        if np.isfinite(done).any():
            ax.plot(t, done, "-", color="black", lw=1.5, label="tier done")
        if spec["deadline_ms"] is not None:
            ax.axhline(spec["deadline_ms"], color="#d62728", ls="--", label="deadline")
        if not drawn:
            _empty(ax, f"tier {tier}: no stage ran in this replay")
            continue
        name = TIER_NAMES.get(tier, "end to end")
        deadline = spec["deadline_ms"]
        title = f"tier {tier} ({name})" + (f", deadline {deadline:g} ms" if deadline else "")
        ax.set_title(title, fontsize=10, loc="left")
        ax.set_ylabel("ms")
        ax.set_yscale("log")
        ax.legend(fontsize=8, loc="upper right", ncols=4)
    axes[-1].set_xlabel("simulated time (s)")
    fig.tight_layout()
    return fig


def plot_misses_drops(doc: dict[str, Any]) -> Figure:
    summary = doc["summary"]
    tiers = sorted(summary["deadline_misses"])
    misses = [summary["deadline_misses"][t] for t in tiers]
    drops = [summary["drops"].get(t, 0) for t in tiers]
    fig = Figure(figsize=(WIDTH_IN, 3.0))
    ax = fig.subplots()
    x = np.arange(len(tiers))
    bars = ax.bar(x - 0.2, misses, 0.4, color="#d62728", label="deadline misses (frames)")
    ax.bar_label(bars, fontsize=8)
    bars = ax.bar(x + 0.2, drops, 0.4, color="#7f7f7f", label="drops")
    ax.bar_label(bars, fontsize=8)
    units = doc.get("drop_units", {})
    ax.set_xticks(
        x,
        [f"tier {t} ({TIER_NAMES.get(t, t)})\ndrops: {units.get(t, 'none')}" for t in tiers],
        fontsize=8,
    )
    ax.set_ylabel("count")
    ax.set_title(f"over {summary['frames']} frames", fontsize=10, loc="left")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_compiles(doc: dict[str, Any]) -> Figure:
    events = doc.get("compile_events", [])
    fig = Figure(figsize=(WIDTH_IN, 2.6))
    ax = fig.subplots()
    if not events:
        _empty(ax, f"no compile events (JIT mode: {doc['run'].get('jit')})")
        return fig
    models = sorted({e["model"] for e in events})
    for state, (marker, color) in EVENT_STYLE.items():
        picked = [e for e in events if _state(e) == state]
        if picked:
            ax.scatter(
                [e["t_s"] for e in picked],
                [models.index(e["model"]) for e in picked],
                marker=marker,
                color=color,
                label=f"{state} ({len(picked)})",
                zorder=3,
            )
    first = min(e["t_s"] for e in events)
    if first < 0:
        ax.axvspan(first, 0.0, color="#eeeeee", label="warm-up, before the first frame", zorder=0)
    ax.set_yticks(range(len(models)), models)
    ax.set_xlabel("wall time since the replay started (s)")
    ax.legend(fontsize=8, loc="upper right")
    fig.tight_layout()
    return fig


def _state(event: dict[str, Any]) -> str:
    if not event["ok"]:
        return "failed"
    return "rejected" if event.get("reason") else "ok"


def plot_hit_rate(doc: dict[str, Any]) -> Figure:
    frames = doc["frames"]
    fig = Figure(figsize=(WIDTH_IN, 2.6))
    ax = fig.subplots()
    if not frames:
        _empty(ax, "no frames")
        return fig
    t = [f["t_s"] for f in frames]
    hits = np.cumsum([f["jit_hits"] for f in frames])
    calls = np.maximum(np.cumsum([f["jit_calls"] for f in frames]), 1)
    ax.plot(t, 100.0 * hits / calls, "-", lw=2, label="all calls so far served specialised")
    share = [100.0 * f["jit_hits"] / f["jit_calls"] if f["jit_calls"] else 0.0 for f in frames]
    ax.plot(t, share, ".", label="calls of the frame served specialised")
    ax.plot(
        t,
        [100.0 * f["hit_rate"] for f in frames],
        "--",
        color="#7f7f7f",
        label="engine hit rate (calls of accepted shapes)",
    )
    ax.set_ylim(-5, 105)
    ax.set_ylabel("%")
    ax.set_xlabel("simulated time (s)")
    ax.set_title(
        f"JIT mode {doc['run'].get('jit')}: calls served by specialisations",
        fontsize=10,
        loc="left",
    )
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_counts(doc: dict[str, Any]) -> Figure:
    frames = _frames(doc)
    fig = Figure(figsize=(WIDTH_IN, 4.2))
    top, bottom = fig.subplots(2, 1, sharex=True)
    t = [f["t_s"] for f in frames]
    points = [f["counts"].get("points") for f in frames]
    if any(p is not None for p in points):
        top.plot(t, points, ".-", color=COLORS[0])
        top.set_ylabel("points")
    else:
        _empty(top, "no lidar points in this replay (detection stream)")
    for i, key in enumerate((*COUNT_KEYS, "predictions")):
        values = [f["counts"].get(key) for f in frames]
        if any(v is not None for v in values):
            axis = bottom if key != "predictions" else bottom.twinx()
            style = ".-" if key != "predictions" else ":"
            axis.plot(t, values, style, color=COLORS[(i + 1) % len(COLORS)], label=key)
            if key == "predictions":
                axis.set_ylabel("prediction rows")
                axis.legend(fontsize=8, loc="upper left")
    bottom.set_ylabel("count")
    bottom.set_xlabel("simulated time (s)")
    bottom.legend(fontsize=8, loc="upper right", ncols=3)
    fig.tight_layout()
    return fig


def html_table(rows: Sequence[tuple[str, Any]]) -> str:
    cells = "".join(
        f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(_fmt(v))}</td></tr>" for k, v in rows
    )
    return f"<table>{cells}</table>"


def html_grid(head: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    top = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    body = "".join(
        "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>" for row in rows
    )
    return f"<table><tr>{top}</tr>{body}</table>"


def _fmt(value: Any) -> str:
    if isinstance(value, dict):
        return ", ".join(f"{k}: {_fmt(v)}" for k, v in value.items())
    if isinstance(value, list):
        return json.dumps(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


STYLE = """
body{font-family:sans-serif;margin:24px;max-width:1060px;color:#222}
h1{font-size:22px}h2{font-size:17px;margin-top:28px;border-bottom:1px solid #ddd}
table{border-collapse:collapse;font-size:13px}th,td{padding:3px 10px;text-align:left;
border-bottom:1px solid #eee;vertical-align:top}th{color:#555;font-weight:normal}
img{max-width:100%;display:block;margin:8px 0}.note{color:#666;font-size:13px}
"""


def render_report(doc: dict[str, Any], title: str) -> str:
    """The report as one HTML string with every plot inline."""
    summary = doc["summary"]
    run = doc.get("run", {})
    plots = [
        ("Latency per stage against its deadline", plot_latency(doc), "latency"),
        ("Deadline misses and drops per tier", plot_misses_drops(doc), "misses and drops"),
        ("Compile events", plot_compiles(doc), "compile timeline"),
        ("Cache hit rate over time", plot_hit_rate(doc), "hit rate"),
        ("Counts per frame", plot_counts(doc), "counts"),
    ]
    sections = "".join(
        f"<h2>{html.escape(name)}</h2>"
        f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{png_base64(fig)}">'
        for name, fig, alt in plots
    )
    topics = doc.get("topics", {})
    used = [
        (u.get("topic", "?"), f"{u.get('msgtype')} as {u.get('role', u.get('name'))}")
        for u in topics.get("used", [])
    ]
    skipped = [(s["topic"], f"{s['msgtype']}: {s['reason']}") for s in topics.get("skipped", [])]
    facts = [
        ("bag", run.get("bag")),
        ("mode", f"{run.get('mode')}, JIT {run.get('jit')}, target {run.get('target')}"),
        ("deterministic", run.get("deterministic")),
        ("frames", f"{summary['frames']} ({summary['dropped_frames']} dropped)"),
        ("simulated / wall", f"{summary['sim_s']} s / {summary['wall_s']} s"),
        ("real-time factor", summary.get("realtime_factor")),
        ("deadline misses per tier", summary["deadline_misses"]),
        ("drops per tier", summary["drops"]),
        ("JIT engine hit rate", summary["hit_rate"]),
        ("compile events", summary["compile_events"]),
    ]
    if summary.get("prediction"):
        facts.append(("prediction", summary["prediction"]))
    latency = html_grid(
        ["stage", "p50", "p95", "p99", "mean", "max"],
        [
            [stage, *(f"{stats.get(k, 0):.2f}" for k in ("p50", "p95", "p99", "mean", "max"))]
            for stage, stats in summary.get("latency_ms", {}).items()
        ],
    )
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>{html_table(facts)}"
        f"<h2>Latency (ms)</h2>{latency}"
        f"<h2>Topics</h2>{html_table(used)}"
        + (f"<p class='note'>skipped:</p>{html_table(skipped)}" if skipped else "")
        + sections
        + "</body></html>"
    )


def write_report(run_dir: Path, out: Path | None = None) -> Path:
    doc = read_metrics(run_dir)
    out = out or Path(run_dir) / REPORT_FILE
    if out.is_dir():
        raise ConfigError(f"report output {out} is a folder")
    try:
        page = render_report(doc, f"Replay report: {Path(run_dir).name}")
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as err:
        # read_metrics checks what every report needs; this catches a field it does not know.
        raise ConfigError(f"{run_dir}: metrics.json is malformed: {err!r}") from err
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, page)
    out.chmod(0o644)
    return out
