"""The FMA peak kernel computes the multiply-adds it is timed for, and the roofline's sums."""

from __future__ import annotations

import numpy as np
import pytest

from dynshape_perception.compiler import tvm_adapter as tvmx
from dynshape_perception.compiler.schedules.context import context_for_target
from dynshape_perception.compiler.targets import load_profile
from dynshape_perception.models.tir_kernels import FEATURES, FMA_CHAINS, fma_peak_kernel
from dynshape_perception.tools.bench.roofline import Roofline, fma_peak_gflops, segmenter_macs

TARGET = load_profile("x86_64").target()


def test_the_peak_kernel_runs_every_chain_to_the_end() -> None:
    threads, iterations = 2, 1000
    lanes = context_for_target(TARGET).vector_lanes
    run = tvmx.build_prim_func(fma_peak_kernel(threads, lanes, iterations), TARGET)
    out = tvmx.aligned_empty((threads, FMA_CHAINS, lanes), np.float32)
    scale = np.linspace(0.999, 1.001, lanes, dtype=np.float32)
    run(out, scale)
    want = np.ones(lanes, np.float32)
    for _ in range(iterations):
        want = want * scale + np.float32(1e-9)
    np.testing.assert_allclose(out, np.broadcast_to(want, out.shape), rtol=1e-5)


def test_the_peak_is_a_positive_rate() -> None:
    assert fma_peak_gflops(TARGET, 1) > 0.0


def test_segmenter_multiply_adds_and_the_share_of_peak() -> None:
    # 4x64 + 64x128 + 128x1 per point.
    assert segmenter_macs((64, 128), FEATURES, 10) == 10 * 8_576
    roof = Roofline(points=10, threads=1, generic_gflops=90.0, fma_peak_gflops=100.0)
    assert roof.as_json() == {
        "P": 10,
        "tvm_threads": 1,
        "generic_gflops": 90.0,
        "fma_peak_gflops": 100.0,
        "share_of_peak": 0.9,
        "headroom": pytest.approx(1.111, abs=1e-3),
    }


def test_a_kernel_without_a_global_symbol_is_a_compile_error() -> None:
    from dynshape_perception.errors import CompileError

    func = fma_peak_kernel(1, 4, 1).without_attr("global_symbol")
    with pytest.raises(CompileError, match="global_symbol"):
        tvmx.build_prim_func(func, TARGET)
