"""The executors under load: tiered against FIFO, with a probe of the platform's stalls."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from dynshape_perception.paramspec import declarations
from dynshape_perception.scheduling.executor import (
    Arrival,
    ExecutorOptions,
    FifoExecutor,
    TieredExecutor,
)
from dynshape_perception.tools.bench.deadlines.calibration import Estimates
from dynshape_perception.tools.bench.deadlines.stream import Bench, Executor, Run

log = logging.getLogger(__name__)

RATES = {"1x": 1.0, "2x": 2.0}
DRAIN_S = 15.0
# The nodes' own: each time tier 1 releases the GIL (a TVM or OpenCV call), a shared lane
# takes it, and tier 1 waits up to one interval to get it back.
SWITCH_INTERVAL_MS = float(declarations(ExecutorOptions)["switch_interval_ms"].default)
# NumPy's OpenBLAS on one thread while an executor runs: its workers would make a lane's
# BLAS call wait on threads that other lanes pre-empt, and spin for a core after each call.
BLAS_THREADS = 1


def make_executor(kind: str, bench: Bench, estimates: Estimates) -> Executor:
    executor: Executor
    options = ExecutorOptions(
        reserved_workers=1,
        shared_workers=1,
        switch_interval_ms=SWITCH_INTERVAL_MS,
        blas_threads=BLAS_THREADS,
        reserved_rt_priority=bench.reserved_rt,
        shared_boost_rt_priority=bench.shared_boost_rt,
    )
    if kind == "tiered":
        executor = TieredExecutor(bench.tiers, options, [bench.fast.pool, bench.main.pool])
    else:
        # FIFO knows no tier 1, so its lanes are never boosted (boosts_for_tier1).
        executor = FifoExecutor(bench.tiers, options)
    for name, size, ms in estimates:
        executor.set_estimate(name, ms, size)
    return executor


# A lone process that sleeps 1 ms at a time under SCHED_FIFO: its late wake-ups are stalls
# of the platform itself (hypervisor preemption of a vCPU), which no scheduling in the
# guest can prevent. A process, so that it never contends for this one's GIL.
_PROBE = """
import json, os, sys, time
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(int(sys.argv[2])))
except (OSError, AttributeError):
    pass
end = time.perf_counter() + float(sys.argv[1])
stalls = []
while time.perf_counter() < end:
    t0 = time.perf_counter()
    time.sleep(0.001)
    late = (time.perf_counter() - t0 - 0.001) * 1000.0
    if late > float(sys.argv[3]):
        stalls.append(round(late, 1))
print(json.dumps(stalls))
"""
STALL_MS = 5.0


@contextmanager
def platform_probe(duration_s: float, priority: int | None) -> Iterator[dict[str, Any]]:
    """Late wake-ups (> STALL_MS) of a real-time sleeper process running alongside."""
    found: dict[str, Any] = {}
    args = [sys.executable, "-c", _PROBE, str(duration_s), str(priority or 1), str(STALL_MS)]
    probe = subprocess.Popen(args, stdout=subprocess.PIPE, text=True)
    try:
        yield found
    finally:
        out, _ = probe.communicate(timeout=duration_s + 30.0)
        stalls = json.loads(out or "[]")
        found.update(
            {"over_ms": STALL_MS, "count": len(stalls), "max_ms": max(stalls, default=0.0)}
        )


@contextmanager
def realtime_thread(priority: int | None) -> Iterator[bool]:
    """Run the calling thread under SCHED_FIFO while inside; yields whether it applied."""
    tid = threading.get_native_id()
    if priority is None:
        yield False
        return
    try:
        os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(priority))
    except (OSError, AttributeError) as err:
        log.warning("load generator keeps normal scheduling: %s", err)
        yield False
        return
    try:
        yield True
    finally:
        os.sched_setscheduler(tid, os.SCHED_OTHER, os.sched_param(0))


def load_run(
    bench: Bench, kind: str, rate_hz: float, duration_s: float, estimates: Estimates
) -> dict[str, Any]:
    executor = make_executor(kind, bench, estimates)
    run = Run(bench, executor)
    period = 1.0 / rate_hz
    frames = max(1, int(duration_s * rate_hz))
    # The generator stands in for the sensor driver and the subscription thread, which a
    # real-time stack runs at real-time priority: it mostly sleeps, and it submits tier 1.
    with (
        platform_probe(duration_s + 1.0, bench.reserved_rt) as stalls,
        realtime_thread(bench.reserved_rt) as generator_rt,
        _closing(executor),
    ):
        t0 = time.perf_counter()
        wall0 = time.time()
        for frame in range(frames):
            delay = t0 + frame * period - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            stamp = wall0 + frame * period
            jobs = run.jobs(frame, stamp)
            # Each topic arrives when its first unit is submitted, as in a subscription callback.
            arrivals: dict[str, Arrival] = {}
            for job in jobs:
                if job.topic not in arrivals:
                    arrivals[job.topic] = executor.arrive(job.topic, stamp)
                executor.submit(
                    job.fn,
                    job.tier,
                    arrival=arrivals[job.topic],
                    name=job.name,
                    speculative=job.speculative,
                    size=job.size,
                )
        drained = executor.drain(DRAIN_S)
        elapsed = time.perf_counter() - t0
        snapshot = executor.snapshot()
    spec = {d: p.stats.as_dict() for d, p in run.predictors.items()}
    return {
        "platform_stalls": stalls,
        "generator_realtime": generator_rt,
        "frames": frames,
        "rate_hz": round(rate_hz, 2),
        "elapsed_s": round(elapsed, 2),
        "drained": drained,
        "snapshot": snapshot,
        "counters": dict(run.counters),
        "speculation": spec,
    }


@contextmanager
def _closing(executor: Executor) -> Iterator[Executor]:
    try:
        yield executor
    finally:
        executor.close()


def tier_table(snapshot: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        key: {
            "deadline_ms": st["deadline_ms"],
            "p99_ms": st["p99_ms"],
            "misses": st["misses"],
            "dropped": st["dropped"],
            "completed": st["completed"],
        }
        for key, st in snapshot["tiers"].items()
    }
