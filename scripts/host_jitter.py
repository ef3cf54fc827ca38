"""How much the host alone spreads a frame-sized piece of fixed work: its tail floor.

Usage: PYTHON scripts/host_jitter.py [SECONDS] [WORK_MS]  (default: 15 10)
Two single-threaded workloads, each sized once to take about WORK_MS, are run over and over
for SECONDS each with a 4 ms sleep between runs, as a node idles between frames: "numpy"
(elementwise arithmetic, a sort and reductions over a 120,000 x 4 cloud, as the lidar
stages touch memory) and "python" (an interpreter loop, as the tracker's and the encoders'
Python code). Every run does the same work, so any spread is the host's: its other
tenants, frequency changes, the hypervisor. Prints, per workload, the median, p90, p99 and
max of each run's CPU time and wall time in ms, and p99 / p50. A pipeline whose p99 / p50
target lies below these ratios cannot meet it on that host, whatever the pipeline does.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable

import numpy as np

GAP_S = 0.004
WARMUP_RUNS = 20
SIZING_RUNS = 15
MS_PER_S = 1e3
CLOUD_POINTS = 120_000


def numpy_unit() -> Callable[[], float]:
    cloud = np.random.default_rng(0).standard_normal((CLOUD_POINTS, 4)).astype(np.float32)

    def unit() -> float:
        # No BLAS call: its thread pool would make the work depend on the host's cores.
        moved = cloud * np.float32(0.5) + np.float32(1.0)
        ranges = np.hypot(moved[:, 0], moved[:, 1])
        return float(np.sort(ranges)[::1000].sum()) + float((moved * moved).sum())

    return unit


def python_unit() -> float:
    total = 0
    for i in range(50_000):
        total += i * i % 7
    return float(total)


def sized(unit: Callable[[], float], work_ms: float) -> Callable[[], float]:
    """``unit`` repeated as often as takes about ``work_ms`` here."""
    times: list[float] = []
    for _ in range(SIZING_RUNS):
        start = time.thread_time()
        unit()
        times.append(time.thread_time() - start)
    once_ms = max(float(np.median(times)) * MS_PER_S, 1e-3)
    repeats = max(1, round(work_ms / once_ms))

    def work() -> float:
        return sum(unit() for _ in range(repeats))

    return work


def spread(work: Callable[[], float], seconds: float) -> tuple[np.ndarray, np.ndarray]:
    """Each run's CPU time and wall time, in ms."""
    for _ in range(WARMUP_RUNS):
        work()
    cpu: list[float] = []
    wall: list[float] = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        cpu0, wall0 = time.thread_time(), time.perf_counter()
        work()
        cpu.append((time.thread_time() - cpu0) * MS_PER_S)
        wall.append((time.perf_counter() - wall0) * MS_PER_S)
        time.sleep(GAP_S)
    return np.asarray(cpu), np.asarray(wall)


def line(values: np.ndarray) -> str:
    p50, p90, p99 = np.percentile(values, [50, 90, 99])
    return (
        f"p50 {p50:.2f} p90 {p90:.2f} p99 {p99:.2f} max {values.max():.2f} p99/p50 {p99 / p50:.2f}"
    )


def main(argv: list[str]) -> None:
    seconds = float(argv[0]) if argv else 15.0
    work_ms = float(argv[1]) if len(argv) > 1 else 10.0
    for name, unit in (("numpy", numpy_unit()), ("python", python_unit)):
        cpu, wall = spread(sized(unit, work_ms), seconds)
        print(f"{name}: {cpu.size} runs")
        print(f"  cpu  ms {line(cpu)}")
        print(f"  wall ms {line(wall)}")


if __name__ == "__main__":
    main(sys.argv[1:])
