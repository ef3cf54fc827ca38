"""Per-target knobs of the CPU schedule rules: vector lanes, tiles and register blocks."""

from __future__ import annotations

from dataclasses import dataclass

from dynshape_perception.compiler import tvm_adapter as tvmx
from dynshape_perception.models.tir_kernels import MIN_PARALLEL_WORK


@dataclass(frozen=True)
class CpuScheduleContext:
    """``vector_lanes`` float32 lanes per register; ``tile_rows`` rows per parallel tile;
    ``register_rows`` x ``register_cols`` accumulators of a GEMM micro-kernel, sized to the
    register file (and below TVM's 1 KiB stack-allocation limit, so LLVM keeps them in
    registers); ``var_bounds`` the upper bounds of the symbolic dims, by name."""

    vector_lanes: int
    tile_rows: int = 16
    parallel: bool = True
    register_rows: int = 6
    register_cols: int = 16
    isa: str = "generic"
    var_bounds: tuple[tuple[str, int], ...] = ()
    # A kernel whose work at the dims' upper bounds is below this many multiply-adds or
    # elements runs serially, since splitting it cannot repay the parallel launch.
    min_parallel_work: int = MIN_PARALLEL_WORK

    def worth_parallel(self, extent: object, work_per_iteration: int) -> bool:
        """Whether a loop of ``extent`` (maybe symbolic) iterations should run in parallel."""
        if not self.parallel:
            return False
        most = tvmx.upper_bound(extent, dict(self.var_bounds))
        # One iteration would still pay the pool's launch.
        return most is None or (most > 1 and most * work_per_iteration >= self.min_parallel_work)


def context_for_target(target: tvmx.Target) -> CpuScheduleContext:
    """From the ISA features LLVM enables for the target's CPU (and its ``mattr``), never from
    CPU names: a CPU newer than this code still gets the schedules its registers fit.

    AVX-512 (avx512f): 16 lanes, 7x32 block (14 of 32 zmm); AVX2 with FMA: 8 lanes, 6x16
    (12 of 16 ymm); NEON: 4 lanes, 6x16 (24 of 32 q registers); any other CPU (x86-64 before
    AVX2, for one): 4 lanes, 6x8 (12 of 16 xmm).
    """
    features = tvmx.cpu_features(target)
    if "avx512f" in features:
        return CpuScheduleContext(vector_lanes=16, register_rows=7, register_cols=32, isa="avx512")
    if {"avx2", "fma"} <= features:
        return CpuScheduleContext(vector_lanes=8, register_rows=6, register_cols=16, isa="avx2")
    if "neon" in features:
        return CpuScheduleContext(vector_lanes=4, register_rows=6, register_cols=16, isa="neon")
    return CpuScheduleContext(vector_lanes=4, register_rows=6, register_cols=8, isa="generic")
