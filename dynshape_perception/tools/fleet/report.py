"""The HTML report of a corpus run: one row per bag, the totals, and plots embedded as PNG."""

from __future__ import annotations

import html
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.figure import Figure

from dynshape_perception.fsutil import atomic_write_text
from dynshape_perception.tools.replay.report import (
    COLORS,
    STYLE,
    TIER_NAMES,
    WIDTH_IN,
    html_table,
    png_base64,
)

REPORT_FILE = "report.html"
TIER_COLORS = ("#d62728", "#ff7f0e", "#9467bd", "#8c564b")
STATUS_COLORS = {"ok": "#2ca02c", "regressed": "#d62728", "failed": "#7f7f7f", "empty": "#bbbbbb"}
EXTRA_STYLE = (
    ".ok{color:#2ca02c}.regressed,.fail{color:#d62728;font-weight:bold}.failed{color:#7f7f7f}"
    "tr.total td{font-weight:bold;border-top:2px solid #999}"
)


def _ms(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}"


def _tiers(counts: dict[str, int]) -> str:
    return " / ".join(str(counts[t]) for t in sorted(counts))


def _short(node: str | None) -> str:
    return (node or "")[:8]


def plot_latency(rows: Sequence[dict[str, Any]]) -> Figure:
    """p50 and p99 frame latency per bag."""
    fig = Figure(figsize=(WIDTH_IN, 3.2))
    ax = fig.subplots()
    shown = [r for r in rows if r["latency_p50_ms"] is not None]
    if not shown:
        ax.text(0.5, 0.5, "no bag replayed", ha="center", va="center", transform=ax.transAxes)
        return fig
    x = np.arange(len(shown))
    ax.bar(x - 0.2, [r["latency_p50_ms"] for r in shown], 0.4, color=COLORS[0], label="p50")
    ax.bar(x + 0.2, [r["latency_p99_ms"] for r in shown], 0.4, color=COLORS[1], label="p99")
    ax.set_xticks(x, [r["name"] for r in shown], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("frame latency (ms)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_misses_drops(rows: Sequence[dict[str, Any]]) -> Figure:
    """Deadline misses per tier (stacked) and drops per bag."""
    fig = Figure(figsize=(WIDTH_IN, 3.2))
    ax = fig.subplots()
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for i, tier in enumerate(("1", "2", "3", "4")):
        values = np.array([r["tier_misses"][tier] for r in rows], dtype=float)
        if values.any():
            label = f"misses, tier {tier} ({TIER_NAMES[tier]})"
            ax.bar(x - 0.2, values, 0.4, bottom=bottom, color=TIER_COLORS[i], label=label)
            bottom += values
    drops = [sum(r["drops"].values()) for r in rows]
    ax.bar(x + 0.2, drops, 0.4, color="#7f7f7f", label="drops")
    ax.set_xticks(x, [r["name"] for r in rows], rotation=45, ha="right", fontsize=8)
    ax.set_ylabel("count")
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def plot_timeline(rows: Sequence[dict[str, Any]]) -> Figure:
    """When each bag ran, on which worker of which node: the corpus spread over the cluster."""
    ran = [r for r in rows if not r["reused"] and "started_s" in r["timing"]]
    fig = Figure(figsize=(WIDTH_IN, 0.6 + 0.35 * max(len({r["worker_pid"] for r in ran}), 2)))
    ax = fig.subplots()
    if not ran:
        ax.text(0.5, 0.5, "every bag was kept from an earlier run", ha="center", va="center")
        return fig
    t0 = min(r["timing"].get("submitted_s") or r["timing"]["started_s"] for r in ran)
    lanes = sorted({(r["node_id"] or "", r["worker_pid"]) for r in ran})
    nodes = sorted({lane[0] for lane in lanes})
    for r in ran:
        lane = lanes.index((r["node_id"] or "", r["worker_pid"]))
        start = r["timing"]["started_s"] - t0
        width = max(r["timing"]["finished_s"] - r["timing"]["started_s"], 1e-3)
        color = STATUS_COLORS.get(r["status"], COLORS[nodes.index(lanes[lane][0]) % len(COLORS)])
        ax.barh(lane, width, left=start, color=color, edgecolor="white")
        ax.text(start + width / 2, lane, r["name"], ha="center", va="center", fontsize=7)
    ax.set_yticks(range(len(lanes)), [f"node {_short(n)} pid {p}" for n, p in lanes], fontsize=8)
    ax.set_xlabel("seconds since the first task was submitted")
    fig.tight_layout()
    return fig


def _bag_table(rows: Sequence[dict[str, Any]], totals: dict[str, Any]) -> str:
    head = [
        "bag",
        "tags",
        "status",
        "frames",
        "tier misses 1/2/3/4",
        "drops 1/2/3/4",
        "p50 ms",
        "p99 ms",
        "golden",
        "node",
        "note",
    ]
    cells = []
    for r in rows:
        status = r["status"] + (" (kept)" if r["reused"] else "")
        golden = r["golden"] or "none"
        values = [
            html.escape(r["name"]),
            html.escape(", ".join(r["tags"])),
            f"<span class='{r['status']}'>{html.escape(status)}</span>",
            f"{r['frames']} ({r['dropped_frames']} dropped)",
            _tiers(r["tier_misses"]),
            _tiers(r["drops"]),
            _ms(r["latency_p50_ms"]),
            _ms(r["latency_p99_ms"]),
            f"<span class='{golden}'>{golden}</span>",
            html.escape(_short(r["node_id"])),
            html.escape(r["reason"] or ""),
        ]
        cells.append("<tr>" + "".join(f"<td>{v}</td>" for v in values) + "</tr>")
    total = [
        "total",
        "",
        f"{totals['ok']} ok, {totals['regressed']} regressed, {totals['failed']} failed",
        f"{totals['frames']} ({totals['dropped_frames']} dropped)",
        _tiers(totals["tier_misses"]),
        _tiers(totals["drops"]),
        "",
        "",
        f"{totals['golden_failed']} of {totals['golden_checked']} fail",
        "",
        "",
    ]
    cells.append("<tr class='total'>" + "".join(f"<td>{v}</td>" for v in total) + "</tr>")
    top = "".join(f"<th>{html.escape(h)}</th>" for h in head)
    return f"<table><tr>{top}</tr>{''.join(cells)}</table>"


def _worker_table(workers: Sequence[dict[str, Any]]) -> str:
    head = "".join(
        f"<th>{h}</th>"
        for h in ("node", "host", "pid", "bags", "compiles", "cache hits", "peak RSS MB")
    )
    body = "".join(
        "<tr>"
        + "".join(
            f"<td>{html.escape(str(v))}</td>"
            for v in (
                _short(w["node_id"]),
                w["host"],
                w["pid"],
                w["bags"],
                w["compiles"],
                w["cache_hits"],
                w["peak_rss_mb"],
            )
        )
        + "</tr>"
        for w in workers
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def render_fleet_report(document: dict[str, Any], title: str) -> str:
    rows = document["bags"]
    totals = document["totals"]
    run = document.get("run", {})
    facts = [
        ("corpus", document.get("corpus")),
        ("Ray", run.get("address")),
        ("nodes used", len(document.get("nodes", []))),
        ("bags", f"{totals['bags']} ({totals['reused']} kept from an earlier run)"),
        ("wall", f"{run.get('wall_s')} s"),
    ]
    plots = [
        ("Frame latency per bag", plot_latency(rows), "latency per bag"),
        ("Deadline misses and drops per bag", plot_misses_drops(rows), "misses and drops"),
        ("Bags over the cluster's workers", plot_timeline(rows), "timeline"),
    ]
    sections = "".join(
        f"<h2>{html.escape(name)}</h2>"
        f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{png_base64(fig)}">'
        for name, fig, alt in plots
    )
    return (
        "<!DOCTYPE html><html><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{STYLE}{EXTRA_STYLE}</style></head><body>"
        f"<h1>{html.escape(title)}</h1>{html_table(facts)}"
        f"<h2>Bags</h2>{_bag_table(rows, totals)}"
        f"<h2>Workers</h2>{_worker_table(document.get('workers', []))}"
        f"{sections}</body></html>"
    )


def write_fleet_report(run: Path, document: dict[str, Any]) -> Path:
    out = Path(run) / REPORT_FILE
    atomic_write_text(out, render_fleet_report(document, f"Fleet replay: {Path(run).name}"))
    out.chmod(0o644)
    return out
