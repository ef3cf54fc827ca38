"""Per-target knobs of the CPU schedule rules: vector lanes, tiles and register blocks."""

from __future__ import annotations

from dataclasses import dataclass

from dynshape_perception.compiler import tvm_adapter as tvmx
from dynshape_perception.models.tir_kernels import MIN_PARALLEL_WORK

AVX512_CPUS = frozenset(
    {
        "znver4",
        "znver5",
        "skylake-avx512",
        "cascadelake",
        "cooperlake",
        "icelake-server",
        "sapphirerapids",
        "emeraldrapids",
        "graniterapids",
    }
)


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
    """AVX-512: 16 lanes, 7x32 block (14 of 32 zmm); AVX2: 8 lanes, 6x16 (12 of 16 ymm);
    NEON and anything else: 4 lanes, 6x16 (24 of 32 q registers)."""
    mcpu = str(target.attrs.get("mcpu", ""))
    mattr = [str(a) for a in target.attrs.get("mattr", [])]
    triple = str(target.attrs.get("mtriple", ""))
    if triple.startswith("aarch64") or any("neon" in a for a in mattr):
        return CpuScheduleContext(vector_lanes=4, register_rows=6, register_cols=16, isa="neon")
    if mcpu in AVX512_CPUS or any("avx512" in a for a in mattr):
        return CpuScheduleContext(vector_lanes=16, register_rows=7, register_cols=32, isa="avx512")
    return CpuScheduleContext(vector_lanes=8, register_rows=6, register_cols=16, isa="avx2")
