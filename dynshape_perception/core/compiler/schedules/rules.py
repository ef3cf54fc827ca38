"""Dense, reduction and injective schedule rules for llvm targets (x86 AVX2/AVX-512, AArch64 NEON).

Every rule splits symbolic axes with a fixed inner factor and a predicated tail, so one schedule
serves every count; the same rules apply unchanged to static shapes for specialisations.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func

from dynshape_perception.core.compiler import tvm_adapter as tvmx

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class CpuScheduleContext:
    """Per-target knobs: vector lanes for float32 and rows per parallel tile."""

    vector_lanes: int
    tile_rows: int = 16
    parallel: bool = True


@dataclass
class ScheduleReport:
    applied: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


def context_for_target(target: tvmx.Target) -> CpuScheduleContext:
    """Lanes from the target's ISA: 16 on AVX-512, 8 on AVX2, 4 on NEON and anything else."""
    mcpu = str(target.attrs.get("mcpu", ""))
    mattr = [str(a) for a in target.attrs.get("mattr", [])]
    triple = str(target.attrs.get("mtriple", ""))
    if triple.startswith("aarch64") or any("neon" in a for a in mattr):
        return CpuScheduleContext(vector_lanes=4)
    avx512 = {
        "znver4",
        "znver5",
        "skylake-avx512",
        "icelake-server",
        "sapphirerapids",
        "cascadelake",
    }
    if mcpu in avx512 or any("avx512" in a for a in mattr):
        return CpuScheduleContext(vector_lanes=16)
    return CpuScheduleContext(vector_lanes=8)


Rule = Callable[[tirx.PrimFunc, CpuScheduleContext], tirx.PrimFunc | None]


def _extent(sch: s_tir.Schedule, loop: s_tir.schedule.LoopRV) -> int | None:
    ext = sch.get(loop).extent
    return int(ext.value) if isinstance(ext, tirx.IntImm) else None


def _inner_factor(extent: int | None, lanes: int) -> int:
    if extent is None:
        return lanes
    for cand in (lanes, lanes // 2, lanes // 4):
        if cand >= 1 and extent % cand == 0:
            return cand
    return 1


def dense_rule(func: tirx.PrimFunc, ctx: CpuScheduleContext) -> tirx.PrimFunc | None:
    """A matmul with fused elementwise epilogue: row tiles in parallel, register
    accumulators of ``tile_rows x lanes``, the epilogue computed per tile while it is hot."""
    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    if infos is None:
        return None
    reductions = [b for b in infos if b.is_reduction()]
    if len(reductions) != 1 or infos[0] is not reductions[0]:
        return None
    mm = reductions[0].block_rv
    if any(not b.is_injective() for b in infos[1:]):
        return None
    loops = sch.get_loops(mm)
    kinds = reductions[0].dom_kind()
    # Only [rows, cols, k]: compute-at over fused symbolic axes over-approximates regions.
    if len(loops) != 3 or kinds != "SSR":
        return None
    row, col, red = loops
    ro, ri = sch.split(row, [None, ctx.tile_rows])
    lanes = _inner_factor(_extent(sch, col), ctx.vector_lanes)
    co, ci = sch.split(col, [None, lanes])
    sch.reorder(ro, co, red, ri, ci)
    acc = sch.cache_write(mm, 0, "local")
    sch.reverse_compute_at(acc, co)
    for block in reversed([b.block_rv for b in infos[1:]]):
        sch.reverse_compute_inline(block)
    if ctx.parallel:
        sch.parallel(ro)
    sch.vectorize(sch.get_loops(acc)[-1])
    if lanes > 1:
        sch.vectorize(ci)
    sch.decompose_reduction(mm, red)
    return sch.mod["main"]


def column_reduce_rule(func: tirx.PrimFunc, ctx: CpuScheduleContext) -> tirx.PrimFunc | None:
    """A reduction over the leading (symbolic) axis into a vector, like max-pool over points:
    split the channel axis across threads and keep the reduction loop outside the lanes."""
    sch = s_tir.Schedule(func)
    blocks = sch.get_child_blocks(sch.get_sblock("root")) if _has_root(sch) else []
    if len(blocks) != 2:
        return None
    update = blocks[1]
    loops = sch.get_loops(update)
    if len(loops) != 2:
        return None
    red, chan = loops
    chan_ext = _extent(sch, chan)
    if chan_ext is None:
        return None
    lanes = _inner_factor(chan_ext, ctx.vector_lanes)
    co, ci = sch.split(chan, [None, lanes])
    sch.reorder(co, red, ci)
    if ctx.parallel:
        sch.parallel(co)
    return sch.mod["main"]


def injective_rule(func: tirx.PrimFunc, ctx: CpuScheduleContext) -> tirx.PrimFunc | None:
    """Elementwise and layout kernels: fuse all axes, parallel chunks, vectorised lanes."""
    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    if infos is None or not infos or any(not b.is_injective() for b in infos):
        return None
    for info in infos[:-1]:
        try:
            sch.compute_inline(info.block_rv)
        except Exception:  # noqa: BLE001 - an un-inlinable producer leaves the rule inapplicable
            return None
    last = infos[-1].block_rv
    loops = sch.get_loops(last)
    if not loops:
        return None
    fused = sch.fuse(*loops) if len(loops) > 1 else loops[0]
    outer, _ = sch.split(fused, [None, ctx.vector_lanes * ctx.tile_rows])
    if ctx.parallel:
        sch.parallel(outer)
    return sch.mod["main"]


def _has_root(sch: s_tir.Schedule) -> bool:
    try:
        sch.get_sblock("root")
    except Exception:  # noqa: BLE001
        return False
    return True


RULES: tuple[tuple[str, Rule], ...] = (
    ("dense", dense_rule),
    ("column_reduce", column_reduce_rule),
    ("injective", injective_rule),
)


def apply_cpu_rules(
    mod: tvmx.IRModule, ctx: CpuScheduleContext
) -> tuple[tvmx.IRModule, ScheduleReport]:
    """Schedule every unscheduled PrimFunc with the first rule that accepts it."""
    report = ScheduleReport()
    for name, func in tvmx.prim_funcs(mod).items():
        if tvmx.is_scheduled(func):
            report.skipped[name] = "already scheduled"
            continue
        for rule_name, rule in RULES:
            try:
                scheduled = rule(func, ctx)
            except Exception as err:  # noqa: BLE001 - a rule that does not fit is not an error
                log.debug("rule %s rejected %s: %s", rule_name, name, err)
                scheduled = None
            if scheduled is not None:
                tvmx.replace_prim_func(mod, name, scheduled)
                report.applied[name] = rule_name
                break
        else:
            report.skipped[name] = "no rule matched (hand-written or irregular kernel)"
    return mod, report
