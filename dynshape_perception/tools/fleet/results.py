"""A corpus run's folder: one result folder per bag, the corpus summary JSON and its totals."""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from dynshape_perception.errors import ConfigError
from dynshape_perception.fsutil import atomic_write_text
from dynshape_perception.tools.fleet.task import COMPLETE, EMPTY, FAILED, OK, REGRESSED

BAGS_DIR = "bags"
SUMMARY_FILE = "summary.json"
SUMMARY_VERSION = 1
TIERS = ("1", "2", "3", "4")


def bags_dir(run: Path) -> Path:
    return Path(run) / BAGS_DIR


def remove_stale_stages(run: Path) -> int:
    """Remove the hidden folders that interrupted or killed tasks left half-written;
    called when no task of this run is running."""
    folder = bags_dir(run)
    if not folder.is_dir():
        return 0
    stale = [p for p in folder.iterdir() if p.name.startswith(".") and p.is_dir()]
    for path in stale:
        shutil.rmtree(path, ignore_errors=True)
    return len(stale)


def latency(outcome: dict[str, Any], key: str) -> float | None:
    stats = outcome.get("summary", {}).get("latency_ms", {}).get("total", {})
    value = stats.get(key)
    return float(value) if value is not None else None


def bag_row(outcome: dict[str, Any]) -> dict[str, Any]:
    """One bag's line of the summary: what the report's table shows."""
    summary = outcome.get("summary", {})
    misses = summary.get("deadline_misses", {})
    drops = summary.get("drops", {})
    worker = outcome.get("worker", {})
    timing = outcome.get("timing", {})
    return {
        "name": outcome["name"],
        "bag": outcome["bag"],
        "tags": list(outcome.get("tags", ())),
        "status": outcome["status"],
        "reason": outcome.get("reason"),
        "reused": bool(outcome.get("reused", False)),
        "frames": int(summary.get("frames", 0)),
        "dropped_frames": int(summary.get("dropped_frames", 0)),
        "tier_misses": {t: int(misses.get(t, 0)) for t in TIERS},
        "drops": {t: int(drops.get(t, 0)) for t in TIERS},
        "latency_p50_ms": latency(outcome, "p50"),
        "latency_p99_ms": latency(outcome, "p99"),
        "golden": outcome.get("golden"),
        "output_sha256": outcome.get("output_sha256"),
        "node_id": worker.get("node_id"),
        "host": worker.get("host"),
        "worker_pid": worker.get("pid"),
        "timing": timing,
    }


def totals(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    by_status = {s: sum(1 for r in rows if r["status"] == s) for s in (*COMPLETE, FAILED, EMPTY)}
    return {
        "bags": len(rows),
        **by_status,
        "interrupted": len(rows) - sum(by_status.values()),
        "reused": sum(1 for r in rows if r["reused"]),
        "frames": sum(r["frames"] for r in rows),
        "dropped_frames": sum(r["dropped_frames"] for r in rows),
        "tier_misses": {t: sum(r["tier_misses"][t] for r in rows) for t in TIERS},
        "drops": {t: sum(r["drops"][t] for r in rows) for t in TIERS},
        "golden_checked": sum(1 for r in rows if r["golden"] is not None),
        "golden_failed": sum(1 for r in rows if r["golden"] == "fail"),
    }


def workers(outcomes: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per worker process (host, pid): its node, bags, compiles and peak RSS, from the
    latest report of each (counters only grow within a process)."""
    out: dict[tuple[str, int], dict[str, Any]] = {}
    for outcome in outcomes:
        worker = outcome.get("worker") or {}
        if outcome.get("reused") or "pid" not in worker:
            continue
        key = (worker["host"], worker["pid"])
        entry = out.setdefault(key, {**worker, "bags": 0})
        entry["bags"] += 1
        for name in ("compiles", "cache_hits", "engines_built", "peak_rss_mb"):
            entry[name] = max(entry[name], worker[name])
    return sorted(out.values(), key=lambda w: (w["node_id"] or "", w["pid"]))


def summary_document(
    corpus: str, outcomes: Sequence[dict[str, Any]], run_info: dict[str, Any]
) -> dict[str, Any]:
    rows = [bag_row(o) for o in outcomes]
    return {
        "version": SUMMARY_VERSION,
        "corpus": corpus,
        "run": run_info,
        "totals": totals(rows),
        "nodes": sorted({r["node_id"] for r in rows if r["node_id"]}),
        "workers": workers(outcomes),
        "bags": rows,
    }


def write_summary(run: Path, document: dict[str, Any]) -> Path:
    path = Path(run) / SUMMARY_FILE
    atomic_write_text(path, json.dumps(document, indent=1) + "\n")
    return path


def read_summary(run: Path) -> dict[str, Any]:
    path = Path(run) / SUMMARY_FILE
    try:
        doc = json.loads(path.read_text())
    except (OSError, ValueError, RecursionError) as err:
        raise ConfigError(f"{path} is not a fleet summary: {err}") from err
    if not isinstance(doc, dict) or not isinstance(doc.get("bags"), list):
        raise ConfigError(f"{path} is not a fleet summary")
    return doc


def exit_status(document: dict[str, Any]) -> int:
    """0: every bag replayed and matched; 1: a bag regressed against its golden output;
    3: a bag could not be replayed (and none regressed)."""
    t = document["totals"]
    if t[REGRESSED]:
        return 1
    if t[FAILED] or t["interrupted"]:
        return 3
    return 0 if t[OK] + t[EMPTY] == t["bags"] else 3
