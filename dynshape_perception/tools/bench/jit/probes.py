"""Closed-loop probes of a warm runtime: cache locality, dispatch overhead, exact builds."""

from __future__ import annotations

import itertools
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dynshape_perception.compiler import tvm_adapter as tvmx
from dynshape_perception.compiler.cache import ArtefactCache
from dynshape_perception.models.tir_kernels import FEATURES
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.runtime.executable import LoadedModel
from dynshape_perception.runtime.shapes import Signature
from dynshape_perception.stats import median
from dynshape_perception.tools.bench.jit.stream import Call, make_inputs
from dynshape_perception.tools.bench.roofline import Roofline, fma_peak_gflops, segmenter_macs

WARM_UP_WAIT_S = 600.0
# Calls of the stream replayed closed-loop to measure cache locality (see ``locality``).
LOCALITY_CALLS = 4000
# Generic-served predictor calls timed through the dispatcher and bare (``dispatch_overhead``),
# and the gap after each point cloud there: the open loop's mean gap at the default rate.
OVERHEAD_CALLS = 400
OVERHEAD_GAP_S = 0.003
EXACT_POINTS = (8192, 65536, 131072)
EXACT_REPEATS = 15


def segmenter_exact(
    models: dict[str, Any], profile: Any, work: Path, generic: LoadedModel
) -> tuple[dict[str, float], dict[int, float]]:
    """Static build at an exact point count over the generic build, interleaved, median of
    ``EXACT_REPEATS``: what the best possible segmenter specialisation (no padding) gains.
    Also returns the generic build's median seconds at each point count."""
    model, weights = models["segmenter"]
    cache = ArtefactCache(work / "segmenter_exact")
    out: dict[str, float] = {}
    generic_s: dict[int, float] = {}
    for p in EXACT_POINTS:
        args = make_inputs(Call("segmenter", {"P": p}, p))
        artefact = cache.get_or_build(model, weights, profile, {"P": p}, functions=("forward",))
        exact = LoadedModel(model, artefact.library_path, functions=("forward",))
        times: dict[str, list[float]] = {"generic": [], "exact": []}
        for _ in range(EXACT_REPEATS):
            for label, runner in (("generic", generic), ("exact", exact)):
                began = time.perf_counter()
                runner.run_unchecked("forward", args)
                times[label].append(time.perf_counter() - began)
        generic_s[p] = median(times["generic"])
        out[str(p)] = round(median(times["exact"]) / generic_s[p], 3)
    return out, generic_s


def segmenter_roofline(
    models: dict[str, Any], profile: Any, generic_s: Mapping[int, float]
) -> Roofline:
    """The generic segmenter's multiply-add rate at the largest timed point count against
    this CPU's FMA peak, on as many threads as this (the serving) thread's TVM pool has."""
    model, _ = models["segmenter"]
    points = max(generic_s)
    macs = segmenter_macs(model.config.hidden, FEATURES, points)
    threads = tvmx.cpu_threads()
    return Roofline(
        points,
        threads,
        2.0 * macs / generic_s[points] / 1e9,
        fma_peak_gflops(profile.target(), threads),
    )


def locality(
    engine: Engine, stream: list[Call], inputs: list[list[np.ndarray]], calls: int = LOCALITY_CALLS
) -> dict[str, dict[str, float]]:
    """Closed-loop predictor busy time, runtime over generic, in three orders of the same calls.

    Each specialisation is its own library with its own code and bound weights, so where
    consecutive calls change key, and point clouds in between flush the caches, every switch
    refetches one; the single generic library stays warm. Grouped by key is the hot-cache case.
    """
    # No compile may start or land while the orders are timed against each other.
    for dispatcher in engine.dispatchers.values():
        dispatcher.freeze()
    if engine.pool is not None:
        engine.pool.wait_idle(WARM_UP_WAIT_S)
    head = list(zip(stream[:calls], inputs[:calls], strict=True))
    predictor = engine["predictor"]
    point = engine["segmenter"].generic
    orders = {
        "grouped_by_key": sorted(
            (x for x in head if x[0].model == "predictor"),
            key=lambda x: predictor.key_of(Signature.of("forward", x[0].dims)),
        ),
        "stream_order": [x for x in head if x[0].model == "predictor"],
        "with_point_clouds": head,
    }
    out: dict[str, dict[str, float]] = {}
    for name, order in orders.items():
        busy = {}
        for label, fn in (("generic_s", predictor.generic), ("jit_s", predictor)):
            total = 0.0
            for call, args in order:
                if call.model != "predictor":
                    point("forward", *args)
                    continue
                began = time.perf_counter()
                fn("forward", *args)
                total += time.perf_counter() - began
            busy[label] = round(total, 4)
        busy["ratio"] = round(busy["jit_s"] / busy["generic_s"], 3)
        out[name] = busy
    return out


def dispatch_overhead(
    engine: Engine, stream: list[Call], inputs: list[list[np.ndarray]]
) -> dict[str, float]:
    """What the dispatcher itself costs a call: predictor calls that no specialisation serves,
    through the dispatcher over through its own generic build (both validate), alternating.

    ``cold``: each call after a point cloud and a gap, as calls arrive in the stream, with
    the caches flushed; ``warm``: back to back. Run after ``locality``, frozen and idle.
    """
    predictor = engine["predictor"]
    cached = set(predictor.cache.keys())
    point = engine["segmenter"].generic
    cloud = next((a for c, a in zip(stream, inputs, strict=True) if c.model != "predictor"), None)
    calls = [
        (call, args)
        for call, args in zip(stream, inputs, strict=True)
        if call.model == "predictor"
        and predictor.key_of(Signature.of("forward", call.dims)) not in cached
    ]
    uncached = [args for _, args in calls]
    signatures = {call.signature for call, _ in calls}
    # A warm runtime specialises all but the rarest keys: their calls are cycled, as repeats.
    picked = list(itertools.islice(itertools.cycle(uncached), OVERHEAD_CALLS))
    runners = (("runtime", predictor), ("generic", predictor.generic))
    out: dict[str, float] = {"calls": len(picked), "signatures": len(signatures)}
    # A stream without point clouds has nothing to flush the caches with.
    modes = [("warm", None)] if cloud is None else [("cold", cloud), ("warm", None)]
    for label, flush in modes:
        took = {"runtime": 0.0, "generic": 0.0}
        for i, args in enumerate(picked):
            for name, runner in runners if i % 2 else runners[::-1]:
                if flush is not None:
                    point("forward", *flush)
                    time.sleep(OVERHEAD_GAP_S)
                began = time.perf_counter()
                runner("forward", *args)
                took[name] += time.perf_counter() - began
        if picked:
            out[label] = round(took["runtime"] / took["generic"], 3)
            out[f"{label}_extra_us"] = round(
                (took["runtime"] - took["generic"]) / len(picked) * 1e6, 1
            )
    return out
