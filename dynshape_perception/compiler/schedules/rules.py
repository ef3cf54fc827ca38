"""Dense, matvec, row reduction and injective rules for llvm targets (AVX-512/AVX2/NEON).

Every rule serves every count of a symbolic axis from one schedule: a matmul's rows split at the
last whole tile (the tiles unpredicated, the rest a row at a time), other axes with a fixed inner
factor and a predicated tail. The same rules apply unchanged to static shapes for
specialisations.
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

from dynshape_perception.compiler import tvm_adapter as tvmx
from dynshape_perception.compiler.schedules.context import (
    CpuScheduleContext,
    context_for_target,
)
from dynshape_perception.compiler.schedules.templates import template_rule

log = logging.getLogger(__name__)

# A static innermost axis up to this many vector registers wide is vectorised whole.
MAX_VECTOR_REGS = 4
TEMPLATE_PREFIX = "template["
ALREADY_SCHEDULED = "already scheduled"

__all__ = ["CpuScheduleContext", "ScheduleReport", "apply_cpu_rules", "context_for_target"]


@dataclass
class ScheduleReport:
    applied: dict[str, str] = field(default_factory=dict)
    skipped: dict[str, str] = field(default_factory=dict)

    @property
    def shape_invariant(self) -> bool:
        """Every kernel is a template or scheduled by hand: a static shape changes only the
        values of its loop bounds, never which loops it runs, so a specialisation compiles the
        same code and cannot be faster. A rule, by contrast, chooses by static extents."""
        if not (self.applied or self.skipped):
            return False
        return all(v.startswith(TEMPLATE_PREFIX) for v in self.applied.values()) and all(
            v == ALREADY_SCHEDULED for v in self.skipped.values()
        )


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
    loops = sch.get_loops(infos[0].block_rv)
    # Only [rows, cols, k]: compute-at over fused symbolic axes over-approximates regions.
    if len(loops) != 3 or infos[0].dom_kind() != "SSR":
        return None
    row, col, _ = loops
    col_ext = _extent(sch, col)
    if col_ext is not None and col_ext < ctx.vector_lanes // 2:
        return None  # a narrow output is a matvec
    names = _block_names(sch, infos)
    rows = _extent(sch, row)
    if col_ext is None:
        return _dense_tiles(func, ctx, None, names)[0]
    if rows is not None and rows < ctx.tile_rows:
        # A static count below one tile: one tile of exactly that many rows.
        return _dense_tiles(func, replace(ctx, tile_rows=rows), None, names)[0]
    return _tiled_rows(func, ctx, _dense_tiles, ctx.tile_rows, names, rows)


Tiles = Callable[
    [tirx.PrimFunc, CpuScheduleContext, "bool | None", list[str]], tuple[tirx.PrimFunc, Any, int]
]


def _block_names(sch: s_tir.Schedule, infos: list[Any]) -> list[str]:
    """The matmul block's name, then its epilogue blocks': how the schedules of its parts find
    them, whose loops no longer span the blocks' domains (which the analysis requires)."""
    return [sch.get(b.block_rv).name_hint for b in infos]


def _blocks(sch: s_tir.Schedule, names: list[str]) -> list[Any]:
    return [sch.get_sblock(name) for name in names]


def _accumulator(
    sch: s_tir.Schedule, mm: Any, epilogue: list[Any], at: s_tir.schedule.LoopRV
) -> Any:
    """Local accumulators for ``mm``, written back under ``at`` with the epilogue inlined
    into the write-back, so the epilogue runs on each tile while it is hot."""
    acc = sch.cache_write(mm, 0, "local")
    sch.reverse_compute_at(acc, at)
    for block in reversed(epilogue):
        sch.reverse_compute_inline(block)
    return acc


def _dense_tiles(
    func: tirx.PrimFunc, ctx: CpuScheduleContext, parallel: bool | None, names: list[str]
) -> tuple[tirx.PrimFunc, Any, int]:
    """The dense schedule; with its row-tile loop's extent and the work of one tile.
    ``parallel`` None: parallel where the extent's upper bound carries the work."""
    sch = s_tir.Schedule(func)
    mm, *epilogue = _blocks(sch, names)
    row, col, red = sch.get_loops(mm)
    ro, ri = sch.split(row, [None, ctx.tile_rows])
    lanes = _inner_factor(_extent(sch, col), ctx.vector_lanes)
    co, ci = sch.split(col, [None, lanes])
    sch.reorder(ro, co, red, ri, ci)
    acc = _accumulator(sch, mm, epilogue, co)
    extent, work = sch.get(ro).extent, _work(sch, [co, red, ri, ci])
    if ctx.worth_parallel(extent, work) if parallel is None else parallel:
        sch.parallel(ro)
    sch.vectorize(sch.get_loops(acc)[-1])
    if lanes > 1:
        sch.vectorize(ci)
    sch.decompose_reduction(mm, red)
    return sch.mod["main"], extent, work


def matvec_rule(func: tirx.PrimFunc, ctx: CpuScheduleContext) -> tirx.PrimFunc | None:
    """A matmul with a narrow output (a score head, ``[rows, k] @ [k, 1]``) and its epilogue:
    vector lanes run across rows, so each k step is one gather and one FMA for ``lanes`` rows,
    instead of a serial dependency chain per row."""
    sch = s_tir.Schedule(func)
    infos = _reduction_with_epilogue(sch)
    if infos is None:
        return None
    loops = sch.get_loops(infos[0].block_rv)
    kinds = infos[0].dom_kind()
    if kinds == "SSR":
        col_ext = _extent(sch, loops[1])
        if col_ext is None or col_ext >= ctx.vector_lanes // 2:
            return None
    elif kinds != "SR":
        return None
    names = _block_names(sch, infos)
    rows = _extent(sch, loops[0])
    if rows is not None and rows < ctx.vector_lanes:
        # Too few rows to fill the lanes: a row at a time, across its columns.
        return _row_schedule(func, ctx, names)
    return _tiled_rows(func, ctx, _matvec_tiles, ctx.vector_lanes, names, rows)


def gemv_rule(func: tirx.PrimFunc, ctx: CpuScheduleContext) -> tirx.PrimFunc | None:
    """A matmul of a single static row (``[1, k] @ [k, cols]``: a specialisation for one
    agent) and its epilogue: that row, vectorised across its columns.

    The analysis drops the unit row, so the other rules would take the columns for rows (or
    the row for a tile of them) and run a whole predicated tile for it.
    """
    sch = s_tir.Schedule(func)
    infos = _reduction_with_epilogue(sch)
    if infos is None or infos[0].dom_kind() != "SR":
        return None
    names = _block_names(sch, infos)
    written = s_tir.Schedule(func)
    loops = written.get_loops(written.get_sblock(names[0]))
    if len(loops) != 3 or _extent(written, loops[0]) != 1:
        return None
    return _row_schedule(func, ctx, names)


def _matvec_tiles(
    func: tirx.PrimFunc, ctx: CpuScheduleContext, parallel: bool | None, names: list[str]
) -> tuple[tirx.PrimFunc, Any, int]:
    """The matvec schedule, as ``_dense_tiles`` returns it."""
    sch = s_tir.Schedule(func)
    mm, *epilogue = _blocks(sch, names)
    loops = sch.get_loops(mm)
    row, red = loops[0], loops[-1]
    col = loops[1] if len(loops) == 3 else None
    groups, rv = sch.split(row, [None, ctx.vector_lanes])
    ro, rm = sch.split(groups, [None, ctx.tile_rows])
    order = [ro, rm, red, rv] if col is None else [ro, rm, col, red, rv]
    sch.reorder(*order)
    acc = _accumulator(sch, mm, epilogue, rm)
    extent, work = sch.get(ro).extent, _work(sch, order[1:])
    if ctx.worth_parallel(extent, work) if parallel is None else parallel:
        sch.parallel(ro)
    sch.vectorize(rv)
    sch.vectorize(sch.get_loops(acc)[-1])
    sch.decompose_reduction(mm, red)
    return sch.mod["main"], extent, work


def _tiled_rows(
    func: tirx.PrimFunc,
    ctx: CpuScheduleContext,
    tiles: Tiles,
    tile: int,
    names: list[str],
    rows: int | None,
) -> tirx.PrimFunc:
    """A matmul over ``rows`` (None: symbolic): whole tiles of ``tile`` rows, then the rest a
    row at a time.

    Tiled over a count that ``tile`` may not divide, every tile needs a predicate on its
    rows. Inside the vector lanes it makes LLVM scalarise the whole kernel; inside a register
    tile it keeps symbolic accumulators in memory. Split at the last whole tile, the tiles
    need no predicate and run as a static build would, and the few rows left cost their rows.

    The tiles run in parallel only for a call whose count carries the work to repay waking
    the pool: the upper bound that would make the loop parallel says nothing of the usual call.
    """
    if rows is not None:
        # Static: tiles with a predicate on the last one's rows, as ever. Split, the whole
        # tiles' nest would cover fewer rows than its epilogue's static domain, which
        # inlining the epilogue refuses.
        return tiles(func, ctx, None, names)[0]
    parts = _split_rows(func, tile)
    if parts is None:
        return _row_schedule(func, ctx, names)
    whole, rest = parts
    serial, extent, work = tiles(whole, ctx, False, names)
    body = serial
    if ctx.worth_parallel(extent, work):
        parallel = tiles(whole, ctx, True, names)[0]
        # Tiles, not work, on the left: tiles x work overflows an int32 count.
        enough = extent >= tirx.const(-(-ctx.min_parallel_work // work), tvmx.expr_dtype(extent))
        body = _joined(parallel, serial, lambda a, b: tirx.IfThenElse(enough, a, b))
    # In this order only: a tile's write-back may also store stale values to the rows after
    # the last whole tile (its domain is all rows), which the one-row nest then overwrites.
    joined = _joined(body, _row_schedule(rest, ctx, names), lambda a, b: tirx.SeqStmt([a, b]))
    # The nests share the loops they did not split, each defined once per nest; a reduction
    # over the row count gets two bounds for one var, which lowering refuses.
    return tvmx.fresh_loop_vars(joined)


def _split_rows(func: tirx.PrimFunc, tile: int) -> tuple[tirx.PrimFunc, tirx.PrimFunc] | None:
    """``func`` over its first ``rows // tile * tile`` rows, and over the rows after them: its
    loop nests (the matmul's and its epilogue's) each lead with the row loop, bound trivially.
    None for a function of another form."""
    block = func.body.block
    nests = list(block.body.seq) if isinstance(block.body, tirx.SeqStmt) else [block.body]
    if not all(isinstance(n, tirx.For) for n in nests):
        return None
    rows = nests[0].extent
    if any(not tvmx.same_expr(n.extent, rows) or not _is_zero(n.min) for n in nests):
        return None
    size = tirx.const(tile, tvmx.expr_dtype(rows))
    whole = tirx.floordiv(rows, size) * size
    heads, tails = [], []
    for nest in nests:
        var = tirx.Var(f"{nest.loop_var.name}_rest", tvmx.expr_dtype(nest.loop_var))
        body = _rebound(nest.body, nest.loop_var, whole + var)
        if body is None:
            return None
        heads.append(_loop(nest, nest.loop_var, whole, nest.body))
        tails.append(_loop(nest, var, rows - whole, body))
    return _with_nests(func, heads), _with_nests(func, tails)


def _is_zero(expr: Any) -> bool:
    return isinstance(expr, tirx.IntImm) and int(expr.value) == 0


def _rebound(stmt: Any, var: Any, value: Any) -> Any:
    """``stmt`` with blocks bound to ``value`` where they were bound to ``var`` itself; None
    where ``var`` appears in any other way."""
    if isinstance(stmt, tirx.For):
        body = _rebound(stmt.body, var, value)
        return None if body is None else _loop(stmt, stmt.loop_var, stmt.extent, body)
    if not isinstance(stmt, s_tir.stmt.SBlockRealize):
        return None
    values = []
    for v in stmt.iter_values:
        if v.same_as(var):
            values.append(value)
        elif any(u.same_as(var) for u in tirx.analysis.undefined_vars(v)):
            return None
        else:
            values.append(v)
    return s_tir.stmt.SBlockRealize(values, stmt.predicate, stmt.block)


def _loop(like: Any, var: Any, extent: Any, body: Any) -> Any:
    return tirx.For(var, like.min, extent, like.kind, body, like.thread_binding, like.annotations)


def _with_nests(func: tirx.PrimFunc, nests: list[Any]) -> tirx.PrimFunc:
    return _rooted(func, nests[0] if len(nests) == 1 else tirx.SeqStmt(nests), [])


def _joined(
    first: tirx.PrimFunc, second: tirx.PrimFunc, join: Callable[[Any, Any], Any]
) -> tirx.PrimFunc:
    """Two schedules of one computation (or of parts of it) in one function, their loop nests
    joined by ``join``; each keeps its own loops, block vars and accumulators, since a buffer
    that both used would be planned at the symbolic size."""
    a, b = first.body.block, second.body.block
    return _rooted(first, join(a.body, b.body), list(b.alloc_buffers))


def _rooted(func: tirx.PrimFunc, body: Any, more_buffers: list[Any]) -> tirx.PrimFunc:
    realize = func.body
    block = realize.block
    buffers = list(block.alloc_buffers)
    buffers += [b for b in more_buffers if not any(b.same_as(x) for x in buffers)]
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
    return func.with_body(s_tir.stmt.SBlockRealize(realize.iter_values, realize.predicate, rebuilt))


def _row_schedule(func: tirx.PrimFunc, ctx: CpuScheduleContext, names: list[str]) -> tirx.PrimFunc:
    """One row at a time, serially: its accumulators a few registers, vectorised across
    columns (for the rows after the last whole tile)."""
    sch = s_tir.Schedule(func)
    mm, *epilogue = _blocks(sch, names)
    loops = sch.get_loops(mm)
    row, red = loops[0], loops[-1]
    col = loops[1] if len(loops) == 3 else None
    col_ext = _extent(sch, col) if col is not None else None
    lanes = _inner_factor(col_ext, ctx.vector_lanes)
    order = [row]
    vectorised: list[s_tir.schedule.LoopRV] = []
    unrolled: list[s_tir.schedule.LoopRV] = []
    at = row
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
    acc = _accumulator(sch, mm, epilogue, at)
    for loop in unrolled:
        sch.unroll(loop)
    for loop in vectorised:
        sch.vectorize(loop)
    # Only a loop of the write-back itself: with one column per chunk it has none, and the
    # innermost loop around it is the chunk loop, which holds the reduction.
    around = sch.get_loops(acc)
    depth = next(i for i, loop in enumerate(around) if sch.get(loop).same_as(sch.get(at)))
    own = around[depth + 1 :]
    width = _extent(sch, own[-1]) if own else None
    if width is not None and width > ctx.vector_lanes and lanes > 1 and width % lanes == 0:
        _, inner = sch.split(own[-1], [None, lanes])
        own, width = [inner], lanes
    if width is not None and width > 1:
        sch.vectorize(own[-1])
    sch.decompose_reduction(mm, red)
    return sch.mod["main"]


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
    ("gemv", gemv_rule),
    ("dense", dense_rule),
    ("matvec", matvec_rule),
    ("row_reduce", row_reduce_rule),
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
            report.applied[name] = f"{TEMPLATE_PREFIX}{ctx.isa}]"
            continue
        if tvmx.is_scheduled(func):
            report.skipped[name] = ALREADY_SCHEDULED
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
