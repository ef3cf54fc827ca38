"""The HTML report of ``bench soak``: memory, descriptors, threads and latency over time."""

from __future__ import annotations

import base64
import html
import io
import json
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

from dynshape_perception.fsutil import atomic_write_text

DPI = 100
PANELS = (
    ("rss_mb", "process tree RSS (MB)"),
    ("fds", "open file descriptors"),
    ("threads", "threads"),
    ("latency", "scan to predicted_objects (ms)"),
    ("misses", "misses per sample"),
)


def plot(results: dict[str, Any]) -> Figure:
    """One column per setup; the warm-up shaded."""
    setups = results["setups"]
    warmup_s = float(results["settings"]["warmup_s"])
    fig = Figure(figsize=(5.5 * len(setups), 2.2 * len(PANELS)))
    axes = fig.subplots(len(PANELS), len(setups), squeeze=False)
    for col, (setup, entry) in enumerate(setups.items()):
        rows = entry["rows"]
        t = [r["t_s"] / 60.0 for r in rows]
        for row, (key, label) in enumerate(PANELS):
            ax = axes[row][col]
            if key == "latency":
                for q in ("p50_ms", "p99_ms", "max_ms"):
                    ax.plot(t, [r[q] if r[q] is not None else float("nan") for r in rows], label=q)
                ax.legend(fontsize=7, loc="upper right")
            else:
                ax.plot(t, [r[key] for r in rows], color="#1f77b4")
            ax.axvspan(0.0, warmup_s / 60.0, color="#ddd", zorder=0)
            ax.set_ylabel(label, fontsize=8)
            ax.tick_params(labelsize=7)
            if row == 0:
                ax.set_title(setup)
            if row == len(PANELS) - 1:
                ax.set_xlabel("minutes")
            if key in ("rss_mb", "fds", "threads"):
                ax.set_ylim(bottom=0)
    fig.tight_layout()
    return fig


def png(fig: Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, bbox_inches="tight")
    return buf.getvalue()


def write_report(results: dict[str, Any], path: Path) -> None:
    """A self-contained page: the plot, each setup's summary, the settings."""
    image = base64.b64encode(png(plot(results))).decode("ascii")
    rows = "".join(
        f"<tr><td>{html.escape(setup)}</td><td><pre>"
        f"{html.escape(json.dumps(entry['summary'], indent=1))}</pre></td></tr>"
        for setup, entry in results["setups"].items()
    )
    settings = html.escape(json.dumps(results["settings"]))
    page = (
        "<!doctype html><html><head><meta charset='utf-8'><title>bench soak</title></head>"
        f"<body><h1>bench soak</h1><p>{settings}</p>"
        f"<img alt='soak plot' src='data:image/png;base64,{image}'>"
        f"<table border='1'>{rows}</table></body></html>"
    )
    atomic_write_text(Path(path), page)
