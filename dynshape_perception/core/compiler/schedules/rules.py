"""Dense, matvec, row/column reduction and injective rules for llvm targets (AVX-512/AVX2/NEON).

Every rule splits symbolic axes with a fixed inner factor and a predicated tail, so one schedule
serves every count; the same rules apply unchanged to static shapes for specialisations.
Hand-written template kernels are rebuilt for the target's register blocking instead.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from tvm import s_tir, tirx
from tvm.s_tir.dlight.analysis import normalize_prim_func

from dynshape_perception.core.compiler import tvm_adapter as tvmx
from dynshape_perception.core.compiler.schedules.context import (
    CpuScheduleContext,
    context_for_target,
)
from dynshape_perception.core.compiler.schedules.templates import template_rule

log = logging.getLogger(__name__)

# A static innermost axis up to this many vector registers wide is vectorised whole.
MAX_VECTOR_REGS = 4

__all__ = ["CpuScheduleContext", "ScheduleReport", "apply_cpu_rules", "context_for_target"]


@dataclass
class ScheduleReport:
    applied: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)


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


def _work(sch: s_tir.Schedule, loops: list[s_tir.schedule.LoopRV]) -> int:
    """Iterations of the static loops among ``loops`` (symbolic ones count once)."""
    return math.prod(_extent(sch, loop) or 1 for loop in loops)


def _reduction_with_epilogue(sch: s_tir.Schedule) -> list[Any] | None:
    """The blocks of a single reduction followed only by injective epilogue blocks, or None."""
    infos = normalize_prim_func(sch)
    if infos is None:
        return None
    reductions = [b for b in infos if b.is_reduction()]
    if len(reductions) != 1 or infos[0] is not reductions[0]:
        return None
    if any(not b.is_injective() for b in infos[1:]):
        return None
    return list(infos)


def dense_rule(func: tirx.PrimFunc, ctx: CpuScheduleContext) -> tirx.PrimFunc | None:
    """A matmul with fused elementwise epilogue: row tiles in parallel, register
    accumulators of ``tile_rows x lanes``, the epilogue computed per tile while it is hot."""
    sch = s_tir.Schedule(func)
    infos = _reduction_with_epilogue(sch)
    if infos is None:
        return None
    mm = infos[0].block_rv
    loops = sch.get_loops(mm)
    kinds = infos[0].dom_kind()
    # Only [rows, cols, k]: compute-at over fused symbolic axes over-approximates regions.
    if len(loops) != 3 or kinds != "SSR":
        return None
    row, col, red = loops
    col_ext = _extent(sch, col)
    if col_ext is not None and col_ext < ctx.vector_lanes // 2:
        return None  # a narrow output is a matvec
    if _extent(sch, row) is None and col_ext is not None:
        return _one_row_at_a_time(func, ctx)
    ro, ri = sch.split(row, [None, ctx.tile_rows])
    lanes = _inner_factor(col_ext, ctx.vector_lanes)
    co, ci = sch.split(col, [None, lanes])
    sch.reorder(ro, co, red, ri, ci)
    acc = sch.cache_write(mm, 0, "local")
    sch.reverse_compute_at(acc, co)
    for block in reversed([b.block_rv for b in infos[1:]]):
        sch.reverse_compute_inline(block)
    if ctx.worth_parallel(sch.get(ro).extent, _work(sch, [co, red, ri, ci])):
        sch.parallel(ro)
    sch.vectorize(sch.get_loops(acc)[-1])
    if lanes > 1:
        sch.vectorize(ci)
    sch.decompose_reduction(mm, red)
    return sch.mod["main"]


def matvec_rule(func: tirx.PrimFunc, ctx: CpuScheduleContext) -> tirx.PrimFunc | None:
    """A matmul with a narrow output (a score head, ``[rows, k] @ [k, 1]``) and its epilogue:
    vector lanes run across rows, so each k step is one gather and one FMA for ``lanes`` rows,
    instead of a serial dependency chain per row."""
    sch = s_tir.Schedule(func)
    infos = _reduction_with_epilogue(sch)
    if infos is None:
        return None
    mm = infos[0].block_rv
    loops = sch.get_loops(mm)
    kinds = infos[0].dom_kind()
    if kinds == "SSR":
        row, col, red = loops
        col_ext = _extent(sch, col)
        if col_ext is None or col_ext >= ctx.vector_lanes // 2:
            return None
    elif kinds == "SR":
        row, red = loops
        col = None
    else:
        return None
    # With several outputs a row is one vector of them; a single output per row (a score)
    # keeps rows in the lanes, since one row alone is a serial chain of multiply-adds.
    if _extent(sch, row) is None and col is not None:
        return _one_row_at_a_time(func, ctx)
    lanes = ctx.vector_lanes
    ro, ri = sch.split(row, [None, lanes * ctx.tile_rows])
    rm, rv = sch.split(ri, [None, lanes])
    order = [ro, rm, red, rv] if col is None else [ro, rm, col, red, rv]
    sch.reorder(*order)
    acc = sch.cache_write(mm, 0, "local")
    sch.reverse_compute_at(acc, rm)
    for block in reversed([b.block_rv for b in infos[1:]]):
        sch.reverse_compute_inline(block)
    if ctx.worth_parallel(sch.get(ro).extent, _work(sch, order[1:])):
        sch.parallel(ro)
    sch.vectorize(rv)
    sch.vectorize(sch.get_loops(acc)[-1])
    sch.decompose_reduction(mm, red)
    return sch.mod["main"]


def _one_row_at_a_time(func: tirx.PrimFunc, ctx: CpuScheduleContext) -> tirx.PrimFunc:
    """A matmul over a symbolic row count: accumulators for one row, vectorised across columns.

    A row tile over a symbolic count needs a predicate on its rows. Inside the vector lanes it
    makes LLVM scalarise the whole kernel; inside a register tile it keeps the accumulators at
    the full symbolic size in memory. Predicated per row, the accumulators of a row are a fixed
    handful of registers, and a short count costs its rows, not a tile of 16.

    Row tiles run in parallel only for a call whose count carries the work to repay waking the
    pool: the upper bound that would make the loop parallel says nothing of the usual call.
    """
    serial, extent, work = _row_schedule(func, ctx, parallel=False)
    if not ctx.worth_parallel(extent, work):
        return serial
    parallel, _, _ = _row_schedule(func, ctx, parallel=True)
    return _either(extent * work >= ctx.min_parallel_work, parallel, serial)


def _row_schedule(
    func: tirx.PrimFunc, ctx: CpuScheduleContext, parallel: bool
) -> tuple[tirx.PrimFunc, Any, int]:
    """The one-row schedule; with the row-tile loop's extent and the work of one tile."""
    sch = s_tir.Schedule(func)
    infos = _reduction_with_epilogue(sch)
    assert infos is not None
    mm = infos[0].block_rv
    loops = sch.get_loops(mm)
    row, red = loops[0], loops[-1]
    col = loops[1] if len(loops) == 3 else None
    ro, ri = sch.split(row, [None, ctx.tile_rows])
    col_ext = _extent(sch, col) if col is not None else None
    lanes = _inner_factor(col_ext, ctx.vector_lanes)
    order = [ro, ri]
    vectorised: list[s_tir.schedule.LoopRV] = []
    unrolled: list[s_tir.schedule.LoopRV] = []
    at = ri
    if col is not None and col_ext is not None and col_ext <= ctx.vector_lanes:
        order += [red, col]
        vectorised = [col]
    elif col is not None:
        co, ci = sch.split(col, [None, lanes])
        vectors = sch.get(co).extent
        budget = max(1, ctx.register_rows * ctx.register_cols // ctx.vector_lanes)
        count = int(vectors.value) if isinstance(vectors, tirx.IntImm) else budget
        per_chunk = max(v for v in range(1, min(count, budget) + 1) if count % v == 0)
        cc, cv = sch.split(co, [None, per_chunk])
        order += [cc, red, cv, ci]
        vectorised = [ci] if lanes > 1 else []
        unrolled = [cv]
        at = cc
    else:
        order += [red]
    sch.reorder(*order)
    acc = sch.cache_write(mm, 0, "local")
    sch.reverse_compute_at(acc, at)
    for block in reversed([b.block_rv for b in infos[1:]]):
        sch.reverse_compute_inline(block)
    extent, work = sch.get(ro).extent, _work(sch, order[1:])
    if parallel:
        sch.parallel(ro)
    for loop in unrolled:
        sch.unroll(loop)
    for loop in vectorised:
        sch.vectorize(loop)
    write_back = sch.get_loops(acc)[-1]
    width = _extent(sch, write_back)
    if width is not None and width > ctx.vector_lanes and lanes > 1 and width % lanes == 0:
        _, write_back = sch.split(write_back, [None, lanes])
        width = lanes
    if width is not None and width > 1:
        sch.vectorize(write_back)
    sch.decompose_reduction(mm, red)
    return sch.mod["main"], extent, work


def _either(condition: Any, then: tirx.PrimFunc, otherwise: tirx.PrimFunc) -> tirx.PrimFunc:
    """One function running ``then``'s loop nest where ``condition`` holds, else
    ``otherwise``'s: two schedules of one computation, so each keeps its own loops, block
    vars and accumulators (a buffer shared by both would be planned at the symbolic size)."""
    realize, other = then.body, otherwise.body.block
    block = realize.block
    buffers = list(block.alloc_buffers) + [
        b for b in other.alloc_buffers if not any(b.same_as(x) for x in block.alloc_buffers)
    ]
    body = tirx.IfThenElse(condition, block.body, other.body)
    rebuilt = s_tir.stmt.SBlock(
        block.iter_vars,
        block.reads,
        block.writes,
        block.name_hint,
        body,
        block.init,
        buffers,
        block.match_buffers,
        block.annotations,
    )
    return then.with_body(s_tir.stmt.SBlockRealize(realize.iter_values, realize.predicate, rebuilt))


def row_reduce_rule(func: tirx.PrimFunc, ctx: CpuScheduleContext) -> tirx.PrimFunc | None:
    """Reductions along the last axis and their elementwise neighbours (softmax, norms): every
    stage of one row runs under the row loop, so intermediates stay in cache; rows run in
    parallel when a row carries enough work."""
    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    if infos is None or len(infos) < 2 or not any(b.is_reduction() for b in infos):
        return None
    for info in infos:
        kinds = info.dom_kind()
        if not kinds.startswith("S") or "R" in kinds[:1]:
            return None
    last = infos[-1]
    if last.is_reduction():
        return None
    loops = sch.get_loops(last.block_rv)
    if len(loops) != 2:
        return None
    row, col = loops
    width = _extent(sch, col)
    if width is None:
        return None
    for info in reversed(infos[:-1]):
        sch.compute_at(info.block_rv, row, preserve_unit_loops=True)
    if ctx.worth_parallel(sch.get(row).extent, width * len(infos)):
        sch.parallel(row)
    return sch.mod["main"]


def column_reduce_rule(func: tirx.PrimFunc, ctx: CpuScheduleContext) -> tirx.PrimFunc | None:
    """A reduction over the leading (symbolic) axis into a vector, like max-pool over points:
    channel blocks across threads, the reduction loop outside the vector lanes."""
    sch = s_tir.Schedule(func)
    infos = normalize_prim_func(sch)
    if infos is None:
        return None
    # An update whose init was hoisted by hand (so it runs at P = 0) is no longer a reduction
    # block that loops may be reordered around; such kernels keep their own schedule.
    updates = [b for b in infos if b.is_reduction() and b.dom_kind() == "RS"]
    if len(updates) != 1 or len(infos) != 1:
        return None
    update = updates[0].block_rv
    red, chan = sch.get_loops(update)
    chan_ext = _extent(sch, chan)
    if chan_ext is None:
        return None
    lanes = _inner_factor(chan_ext, ctx.vector_lanes)
    co, ci = sch.split(chan, [None, lanes])
    sch.reorder(co, red, ci)
    sch.decompose_reduction(update, red)
    if ctx.worth_parallel(sch.get(red).extent, chan_ext):
        sch.parallel(co)
    sch.vectorize(ci)
    return sch.mod["main"]


def injective_rule(func: tirx.PrimFunc, ctx: CpuScheduleContext) -> tirx.PrimFunc | None:
    """Elementwise and layout kernels: a short static innermost axis in vector lanes; the outer
    axes fused and split across threads only when that pays (fusing costs a div/mod per row)."""
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
    inner = _extent(sch, loops[-1])
    vector = (
        len(loops) > 1 and inner is not None and 1 < inner <= MAX_VECTOR_REGS * ctx.vector_lanes
    )
    outer = loops[:-1] if vector else loops
    if vector:
        sch.vectorize(loops[-1])
    per_row = inner if vector and inner is not None else 1
    extent = math.prod(sch.get(loop).extent for loop in outer) if outer else 1
    if outer and ctx.worth_parallel(extent, per_row):
        fused = sch.fuse(*outer) if len(outer) > 1 else outer[0]
        chunk, _ = sch.split(fused, [None, max(1, ctx.tile_rows * ctx.vector_lanes // per_row)])
        sch.parallel(chunk)
    return sch.mod["main"]


RULES: tuple[tuple[str, Rule], ...] = (
    ("dense", dense_rule),
    ("matvec", matvec_rule),
    ("row_reduce", row_reduce_rule),
    ("column_reduce", column_reduce_rule),
    ("injective", injective_rule),
)


def apply_cpu_rules(
    mod: tvmx.IRModule, ctx: CpuScheduleContext
) -> tuple[tvmx.IRModule, ScheduleReport]:
    """Rebuild template kernels for ``ctx``, then schedule every unscheduled PrimFunc with the
    first rule that accepts it."""
    report = ScheduleReport()
    bounds = tvmx.symbolic_var_bounds(mod)
    ctx = replace(ctx, var_bounds=tuple(sorted({**dict(ctx.var_bounds), **bounds}.items())))
    for name, func in tvmx.prim_funcs(mod).items():
        rebuilt = template_rule(func, ctx)
        if rebuilt is not None:
            tvmx.replace_prim_func(mod, name, rebuilt)
            report.applied[name] = f"template[{ctx.isa}]"
            continue
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
