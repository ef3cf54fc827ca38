"""``bench soak``: the nodes at 10 Hz on a generated drive for a set time; memory and latency."""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import psutil

from dynshape_perception.errors import ConfigError
from dynshape_perception.fsutil import atomic_write
from dynshape_perception.runtime.process_tree import TreeUsage, tree_usage
from dynshape_perception.stats import DIGITS, percentile
from dynshape_perception.tools.bench.soak_report import plot, png, write_report
from dynshape_perception.tools.sim.drive import DriveConfig, drive_frames

SETUPS = ("composed", "separate")
PREDICTED = "predicted_objects"
FIRST_STAMP_NS = 1_000_000_000
# A generated drive whose counts vary: points per scan, and objects and agents per segment.
POINTS = (5_000, 40_000)
SEGMENT_FRAMES = 50
# How long the nodes may take to answer a scan in the odometry's frame once they are up.
PRIME_WITHIN_S = 60.0
# How long one priming frame is waited for: a frame published while discovery settles is
# lost without a trace, and waiting out the start-up timeout on it would stall the run.
PRIME_FRAME_TIMEOUT_S = 10.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--duration-s", type=float, default=600.0, help="seconds per setup")
    parser.add_argument("--setups", nargs="+", choices=SETUPS, default=list(SETUPS))
    parser.add_argument("--rate-hz", type=float, default=10.0, help="scans per second")
    parser.add_argument("--sample-s", type=float, default=10.0, help="seconds per sample")
    parser.add_argument(
        "--warmup-s", type=float, default=60.0, help="growth is measured after this"
    )
    parser.add_argument("--drive-frames", type=int, default=200, help="scans cycled through")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated drive")
    parser.add_argument(
        "--miss-after-s",
        type=float,
        default=1.0,
        help="a scan whose predictions are not back within this is a miss",
    )
    parser.add_argument("--params-file", type=Path, default=None, help="node parameters YAML")
    parser.add_argument("--weights-dir", default="", help="weights folder (default: committed)")
    parser.add_argument("--cache-dir", default="", help="artefact cache folder of the nodes")
    parser.add_argument("--startup-timeout-s", type=float, default=300.0)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument("--html", type=Path, default=None, help="write the plots here")
    parser.add_argument("--png", type=Path, default=None, help="write the plot alone here")
    parser.add_argument(
        "--from-json",
        type=Path,
        nargs="+",
        default=None,
        metavar="JSON",
        help="run nothing: report these earlier runs' --json files together, a column per setup",
    )


@dataclass
class Window:
    """What one sampling period saw."""

    t_s: float
    usage: TreeUsage
    harness_rss_mb: float
    sent: int = 0
    latencies_ms: list[float] = field(default_factory=list)
    misses: int = 0

    def row(self) -> dict[str, Any]:
        lat = np.asarray(self.latencies_ms, dtype=np.float64)
        pct = {
            f"p{q}_ms": round(percentile(lat, q), DIGITS) if lat.size else None for q in (50, 99)
        }
        return {
            "t_s": round(self.t_s, 1),
            "rss_mb": round(self.usage.rss_mb, 1),
            "processes": self.usage.processes,
            "threads": self.usage.threads,
            "fds": self.usage.fds,
            "harness_rss_mb": round(self.harness_rss_mb, 1),
            "sent": self.sent,
            "answered": len(self.latencies_ms),
            "misses": self.misses,
            **pct,
            "max_ms": round(float(lat.max()), DIGITS) if lat.size else None,
        }


def _check(args: argparse.Namespace) -> None:
    for name in ("duration_s", "rate_hz", "sample_s", "miss_after_s"):
        value = getattr(args, name)
        if not (np.isfinite(value) and value > 0):
            raise ConfigError(f"--{name.replace('_', '-')} must be a finite number > 0")
    if not (np.isfinite(args.warmup_s) and 0 <= args.warmup_s < args.duration_s):
        raise ConfigError("--warmup-s must be >= 0 and shorter than --duration-s")
    if args.drive_frames < 1:
        raise ConfigError("--drive-frames must be >= 1")


def _drive(args: argparse.Namespace) -> list[tuple[np.ndarray, tuple[float, float, float]]]:
    config = DriveConfig(
        seed=args.seed,
        frames=args.drive_frames,
        period_s=1.0 / args.rate_hz,
        segment_frames=min(SEGMENT_FRAMES, args.drive_frames),
        points_range=POINTS,
    )
    return [(f.points, f.pose) for f in drive_frames(config)]


def _past(due: float) -> bool:
    return time.monotonic() >= due


def _usage(pids: list[int]) -> TreeUsage:
    parts = [tree_usage(pid) for pid in pids]
    return TreeUsage(
        sum(p.rss_bytes for p in parts),
        sum(p.processes for p in parts),
        sum(p.threads for p in parts),
        sum(p.fds for p in parts),
    )


def soak(setup: str, args: argparse.Namespace) -> dict[str, Any]:
    """Open loop: a scan every period whatever came back; a sample every ``sample_s``."""
    from dynshape_perception.testing.session import node_session

    frames = _drive(args)
    overrides: dict[str, bool | int | float | str] = {}
    if args.weights_dir:
        overrides["weights_dir"] = str(args.weights_dir)
    if args.cache_dir:
        overrides["model_cache_dir"] = str(args.cache_dir)
    period_s = 1.0 / args.rate_hz
    harness = psutil.Process()
    with node_session(
        setup,
        params_file=args.params_file,
        overrides=overrides,
        startup_timeout_s=args.startup_timeout_s,
        read_markers=False,
    ) as session:
        probe = session.probe
        points, _ = frames[0]
        stamp = session.prime(points, FIRST_STAMP_NS, PRIME_WITHIN_S, PRIME_FRAME_TIMEOUT_S)
        pids = [proc.pid for proc in session.processes]
        got = probe.received[PREDICTED]
        pending: dict[int, float] = {}
        windows: list[Window] = []
        t0 = time.monotonic()
        window = Window(0.0, _usage(pids), harness.memory_info().rss / 2**20)
        next_sample = t0 + args.sample_s
        k = 0
        while (now := time.monotonic()) < t0 + args.duration_s:
            points, (x, y, yaw) = frames[k % len(frames)]
            probe.publish_odometry(stamp, x, y, yaw)
            probe.publish_points(points, stamp)
            pending[stamp] = probe.published[stamp]
            window.sent += 1
            stamp += round(period_s * 1e9)
            k += 1
            probe.spin_until(partial(_past, t0 + k * period_s), period_s)
            for sent_ns in list(pending):
                item = got.get(sent_ns)
                if item is not None:
                    window.latencies_ms.append((item.t_s - pending.pop(sent_ns)) * 1e3)
                elif time.perf_counter() - pending[sent_ns] > args.miss_after_s:
                    del pending[sent_ns]
                    window.misses += 1
            if now >= next_sample:
                session.check_alive()
                windows.append(window)
                probe.forget(min(pending, default=stamp) - 1)
                window = Window(now - t0, _usage(pids), harness.memory_info().rss / 2**20)
                next_sample += args.sample_s
        windows.append(window)
        codes = session.stop()
    rows = [w.row() for w in windows]
    return {"rows": rows, "summary": summary(rows, args.warmup_s), "exit_codes": codes}


def _growth(rows: list[dict[str, Any]], key: str) -> float | None:
    if len(rows) < 2 or not rows[0][key]:
        return None
    return round(100.0 * (rows[-1][key] - rows[0][key]) / rows[0][key], 2)


def summary(rows: list[dict[str, Any]], warmup_s: float) -> dict[str, Any]:
    """Growth from the first sample after warm-up to the last; p99 of the first and last
    quarter of the samples after it."""
    settled = [r for r in rows if r["t_s"] >= warmup_s] or rows[-1:]
    quarter = max(1, len(settled) // 4)

    def p99(part: list[dict[str, Any]]) -> float | None:
        values = [r["p99_ms"] for r in part if r["p99_ms"] is not None]
        return round(float(np.median(values)), DIGITS) if values else None

    return {
        "samples_after_warmup": len(settled),
        "rss_mb": [settled[0]["rss_mb"], settled[-1]["rss_mb"]],
        "rss_growth_pct": _growth(settled, "rss_mb"),
        "fds": [settled[0]["fds"], settled[-1]["fds"]],
        "threads": [settled[0]["threads"], settled[-1]["threads"]],
        "processes": [settled[0]["processes"], settled[-1]["processes"]],
        "p99_ms_first_last_quarter": [p99(settled[:quarter]), p99(settled[-quarter:])],
        "sent": sum(r["sent"] for r in rows),
        "answered": sum(r["answered"] for r in rows),
        "misses": sum(r["misses"] for r in rows),
        "harness_rss_mb": [rows[0]["harness_rss_mb"], rows[-1]["harness_rss_mb"]],
    }


def _span(pair: list[Any]) -> str:
    return f"{pair[0]} -> {pair[1]}"


def merged(paths: list[Path]) -> dict[str, Any]:
    """Earlier runs as one result: their setups side by side, each once, on equal settings."""
    docs = []
    for path in paths:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError) as err:
            raise ConfigError(f"--from-json {path}: cannot read it: {err}") from err
        if not isinstance(doc, dict) or doc.get("benchmark") != "soak":
            raise ConfigError(f"--from-json {path}: not the --json of bench soak")
        docs.append(doc)
    first = docs[0]
    out = {**first, "setups": {}}
    for path, doc in zip(paths, docs, strict=True):
        if doc["settings"] != first["settings"]:
            raise ConfigError(f"--from-json {path}: other settings than {paths[0]}")
        for setup, entry in doc["setups"].items():
            if setup in out["setups"]:
                raise ConfigError(f"--from-json {path}: setup {setup} is in two files")
            out["setups"][setup] = entry
    return out


def run(args: argparse.Namespace) -> int:
    if args.from_json:
        return _report(merged(args.from_json), args)
    _check(args)
    results: dict[str, Any] = {
        "benchmark": "soak",
        "machine": {"cpu_count": len(os.sched_getaffinity(0)), "platform": platform.platform()},
        "settings": {
            k: getattr(args, k)
            for k in ("duration_s", "rate_hz", "sample_s", "warmup_s", "drive_frames", "seed")
        },
        "setups": {},
    }
    for setup in args.setups:
        results["setups"][setup] = soak(setup, args)
    return _report(results, args)


def _report(results: dict[str, Any], args: argparse.Namespace) -> int:
    print(f"{'setup':<10}{'rss MB':>16}{'growth %':>10}{'fds':>10}{'threads':>10}{'misses':>8}")
    for setup, entry in results["setups"].items():
        s = entry["summary"]
        print(
            f"{setup:<10}{_span(s['rss_mb']):>16}{s['rss_growth_pct']!s:>10}"
            f"{_span(s['fds']):>10}{_span(s['threads']):>10}{s['misses']:>8}"
            f"  p99 {_span(s['p99_ms_first_last_quarter'])} ms"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    if args.html is not None:
        write_report(results, args.html)
        print(f"report written to {args.html}")
    if args.png is not None:
        atomic_write(args.png, png(plot(results)))
        print(f"plot written to {args.png}")
    bad = {
        setup: entry["exit_codes"]
        for setup, entry in results["setups"].items()
        if set(entry["exit_codes"].values()) != {0}
    }
    if bad:
        print(f"nodes that did not exit 0 on SIGINT: {bad}")
    return 1 if bad else 0
