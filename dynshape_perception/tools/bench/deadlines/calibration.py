"""Warm-up and the serial cost of every job of a frame, before any load run."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from functools import partial
from typing import Any

import numpy as np

from dynshape_perception.perception.ground import fit_ground_plane
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.runtime.shapes import Signature
from dynshape_perception.stats import latency_stats
from dynshape_perception.tools.bench.deadlines.stream import CHUNK_EDGES, Bench, Run, exhaust

CALIBRATION_ROUNDS = 4
WARM_WAIT_S = 300.0


def _timed(fn: Callable[[], Any], repeats: int) -> list[float]:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000.0)
    return times


def warm_segmenter(engine: Engine, sizes: Iterable[int]) -> int:
    """Compile the segmenter for these point buckets, wait, and freeze the JIT."""
    dispatcher = engine["segmenter"]
    dispatcher.warm([Signature.of("forward", {"P": int(p)}) for p in sizes])
    if engine.pool is not None:
        engine.pool.wait_idle(WARM_WAIT_S)
    for d in engine.dispatchers.values():
        d.freeze()
    return len(dispatcher.cache)


def choose_chunk(
    engine: Engine, points: np.ndarray, budget_ms: float
) -> tuple[int, dict[str, Any]]:
    """The largest warm bucket whose segmentation p50 fits the chunk budget."""
    plane = fit_ground_plane(points[:, :3]).as_array()
    measured: dict[str, Any] = {}
    chosen = CHUNK_EDGES[0]
    for edge in CHUNK_EDGES:
        cloud = np.ascontiguousarray(np.resize(points, (edge, 4)))
        engine["segmenter"]("forward", cloud, plane)
        stats = latency_stats(_timed(partial(engine["segmenter"], "forward", cloud, plane), 15))
        measured[str(edge)] = stats
        if stats["p50_ms"] <= budget_ms:
            chosen = edge
    return chosen, measured


def calibrate(bench: Bench) -> dict[str, Any]:
    """Serial cost of every job of a frame: the sustainable rate is 1 / mean frame cost.

    Speculative work fills idle time only, so it does not count towards a frame's cost.
    """
    run = Run(bench, None)
    frames = CALIBRATION_ROUNDS * len(bench.sources)
    per_job: dict[str, list[float]] = {}
    per_size: dict[tuple[str, int], list[float]] = {}
    totals = []
    start = time.time()
    for frame in range(frames + len(bench.sources)):
        total = 0.0
        for job in run.jobs(frame, start + frame * 0.1):
            t0 = time.perf_counter()
            exhaust(job.fn())
            ms = (time.perf_counter() - t0) * 1000.0
            if not job.speculative:
                total += ms
            if frame >= len(bench.sources):
                per_job.setdefault(job.name, []).append(ms)
                if job.size is not None:
                    per_size.setdefault((job.name, job.size), []).append(ms)
        if frame >= len(bench.sources):
            totals.append(total)
    mean_ms = float(np.mean(totals))
    return {
        "frame_ms": latency_stats(totals),
        "jobs": {name: latency_stats(times) for name, times in per_job.items()},
        "jobs_by_size": [
            {"name": name, "size": size, **latency_stats(times)}
            for (name, size), times in sorted(per_size.items())
        ],
        "sustainable_hz": round(1000.0 / mean_ms, 2),
        "how_measured": (
            f"every job of {frames} frames ({CALIBRATION_ROUNDS} rounds over "
            f"{len(bench.sources)} scans, after one unmeasured round) run back to back on one "
            "thread with warm kernels; sustainable rate = 1000 / mean frame ms, where a "
            "frame's cost leaves out speculative work (it only fills idle time)"
        ),
    }


def near_field_summary(bench: Bench) -> dict[str, Any]:
    counts, reach = [], []
    for name, points in bench.sources:
        index = bench.near.select(points, bench.planes[name])
        counts.append(int(index.size))
        capped = index.size >= bench.near.max_points
        reach.append(float(points[index, 0].max()) if capped else bench.near.ahead_m)
    return {
        "ahead_m": bench.near.ahead_m,
        "half_width_m": bench.near.half_width_m,
        "ground_band_m": bench.near.ground_band_m,
        "max_points": bench.near.max_points,
        "points_per_scan": dict(zip([n for n, _ in bench.sources], counts, strict=True)),
        "covered_ahead_m": dict(
            zip([n for n, _ in bench.sources], [round(r, 2) for r in reach], strict=True)
        ),
    }


Estimates = list[tuple[str, int | None, float]]


def calibrated_estimates(calibration: dict[str, Any]) -> Estimates:
    """Mean serial cost per job name (any size) and per (name, input size)."""
    out: Estimates = [(n, None, s["mean_ms"]) for n, s in calibration["jobs"].items()]
    out += [(r["name"], r["size"], r["mean_ms"]) for r in calibration["jobs_by_size"]]
    return out
