"""How close a generic build runs to the CPU's float32 FMA peak, measured by a TVM kernel.

A specialisation can only do the same multiply-adds faster: the share of the peak left to the
generic build is the most any specialisation of it could gain.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from dynshape_perception.compiler import tvm_adapter as tvmx
from dynshape_perception.compiler.schedules.context import context_for_target
from dynshape_perception.models.tir_kernels import FMA_CHAINS, fma_peak_kernel
from dynshape_perception.tools.bench.kernels import BenchError

PEAK_ITERATIONS = 1_000_000
PEAK_REPEATS = 5


def fma_peak_gflops(target: tvmx.Target, threads: int) -> float:
    """Float32 GFLOP/s (an FMA is two) of the best of ``PEAK_REPEATS`` runs on ``threads``
    threads of the calling thread's TVM pool."""
    lanes = context_for_target(target).vector_lanes
    run = tvmx.build_prim_func(fma_peak_kernel(threads, lanes, PEAK_ITERATIONS), target)
    out = tvmx.aligned_empty((threads, FMA_CHAINS, lanes), np.float32)
    scale = np.full(lanes, 1.0 + 1e-7, np.float32)
    run(out, scale)
    best = min(_timed(run, out, scale) for _ in range(PEAK_REPEATS))
    if not np.isfinite(out).all():
        raise BenchError("the FMA peak kernel overflowed: its timing measured no FMAs")
    return 2.0 * threads * FMA_CHAINS * lanes * PEAK_ITERATIONS / best / 1e9


def _timed(run: Any, *args: np.ndarray) -> float:
    began = time.perf_counter()
    run(*args)
    return time.perf_counter() - began


@dataclass(frozen=True)
class Roofline:
    points: int
    threads: int
    generic_gflops: float
    fma_peak_gflops: float

    @property
    def share_of_peak(self) -> float:
        return self.generic_gflops / self.fma_peak_gflops

    def as_json(self) -> dict[str, float]:
        return {
            "P": self.points,
            "tvm_threads": self.threads,
            "generic_gflops": round(self.generic_gflops, 1),
            "fma_peak_gflops": round(self.fma_peak_gflops, 1),
            "share_of_peak": round(self.share_of_peak, 3),
            # The most a specialisation doing the same multiply-adds could speed this up.
            "headroom": round(1.0 / self.share_of_peak, 3),
        }


def segmenter_macs(hidden: tuple[int, int], features: int, points: int) -> int:
    """Multiply-adds of the segmenter's dense layers and score head on ``points`` points."""
    h1, h2 = hidden
    return points * (features * h1 + h1 * h2 + h2)
