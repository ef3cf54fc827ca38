"""The segmenter's point MLP and score head fused in one tiled CPU kernel (TVMScript)."""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from tvm.script import tirx as T

from dynshape_perception.models.tir_kernels import FEATURES, GROUND_WIDTH, POINT_WIDTH

# The CPU schedule pass rebuilds the kernel through this factory with the target's blocking.
TEMPLATE = f"{__name__}:instantiate"
# Parallel chunks of tiles: each allocates its tile buffers once (they exceed the stack limit, so
# each allocation is a workspace call), and 64 leave enough chunks to balance threads.
CHUNKS = 64
# Register accumulators must stay below TVM's stack-allocation limit (1 KiB): larger local
# buffers become workspace allocations, which LLVM cannot promote to registers.
MAX_STACK_BYTES = 1020
FLOAT_BYTES = 4
# Points per tile: the features and f1 of one tile (about 9 KiB at 64 channels) stay in L1.
TILE_POINTS = 32


@dataclass(frozen=True)
class MicroTile:
    """Register block of the fused kernel: ``rows`` points x ``cols`` channels of accumulators,
    ``lanes`` floats per vector register, ``blocks`` row blocks per tile of points."""

    rows: int = 7
    cols: int = 32
    lanes: int = 16
    blocks: int = 5

    @property
    def tile(self) -> int:
        return self.rows * self.blocks

    @classmethod
    def for_registers(cls, rows: int, cols: int, lanes: int) -> MicroTile:
        return cls(rows, cols, lanes, max(1, round(TILE_POINTS / rows)))


def instantiate(params: Mapping[str, Any], ctx: Any) -> Any:
    """The kernel for a CPU schedule context (``register_rows/cols``, ``vector_lanes``)."""
    hidden = tuple(int(h) for h in params["hidden"])
    return point_mlp_kernel(
        (hidden[0], hidden[1]),
        float(params["range_scale"]),
        float(params["height_scale"]),
        MicroTile.for_registers(ctx.register_rows, ctx.register_cols, ctx.vector_lanes),
    )


def col_block(width: int, cols: int, lanes: int) -> int:
    """The widest divisor of ``width`` not above ``cols``, preferring multiples of ``lanes``."""
    divisors = [d for d in range(1, min(width, cols) + 1) if width % d == 0]
    vector = [d for d in divisors if d % lanes == 0]
    return max(vector or divisors)


@functools.cache
def point_mlp_kernel(
    hidden: tuple[int, int],
    range_scale: float,
    height_scale: float,
    micro: MicroTile | None = None,
) -> Any:
    """``points [P, 4], ground [4]``, two dense layers and the score head -> ``scores [P]``.

    Per parallel chunk of point tiles the features and f1 stay in local tiles, and f2 never
    leaves the register accumulators: the score head's products are summed into ``lanes``
    partial sums per point as each block of f2 is finished, so no [P, h] intermediate is
    ever written. The last tile computes on rows clamped to P - 1: a duplicate of a real point
    rewrites that point's own score, so the hot loops carry no predicates.
    """
    mt = micro or MicroTile()
    h1, h2 = hidden
    rows, tile, lanes = mt.rows, mt.tile, mt.lanes
    cols = max(1, min(mt.cols, MAX_STACK_BYTES // (FLOAT_BYTES * rows)))
    c1 = col_block(h1, cols, lanes)
    c2 = col_block(h2, cols, lanes)
    # Partial sums of the score head per point: one vector when c2 is a multiple of the lanes.
    s_lanes = math.gcd(c2, lanes)
    inv_range = 1.0 / range_scale
    inv_height = 1.0 / height_scale
    params = {
        "hidden": list(hidden),
        "range_scale": float(range_scale),
        "height_scale": float(height_scale),
    }

    @T.prim_func(private=True)
    def point_mlp(
        var_points: T.handle,
        ground: T.Buffer((GROUND_WIDTH,), "float32"),
        w1: T.Buffer((FEATURES, h1), "float32"),
        b1: T.Buffer((h1,), "float32"),
        w2: T.Buffer((h1, h2), "float32"),
        b2: T.Buffer((h2,), "float32"),
        ws: T.Buffer((h2, 1), "float32"),
        bs: T.Buffer((1,), "float32"),
        var_scores: T.handle,
    ) -> None:
        T.func_attr(
            {
                "tirx.noalias": True,
                "tirx.is_scheduled": True,
                "dynshape.template": TEMPLATE,
                "dynshape.params": params,
            }
        )
        n = T.int64()
        points = T.match_buffer(var_points, (n, POINT_WIDTH), "float32")
        scores = T.match_buffer(var_scores, (n,), "float32")
        ntiles = (n + tile - 1) // tile
        nchunks = T.min(ntiles, T.int64(CHUNKS))
        for ch in T.parallel(nchunks):
            raw = T.decl_buffer((tile, POINT_WIDTH), "float32")
            feat = T.decl_buffer((tile, FEATURES), "float32")
            f1 = T.decl_buffer((tile, h1), "float32")
            for t in range(ch * ntiles // nchunks, (ch + 1) * ntiles // nchunks):
                for r in range(tile):
                    for k in T.unroll(POINT_WIDTH):
                        raw[r, k] = points[T.min(t * tile + r, n - 1), k]
                    feat[r, 0] = (
                        ground[0] * raw[r, 0] + ground[1] * raw[r, 1] + ground[2] * raw[r, 2]
                    ) * T.float32(inv_height) + ground[3] * T.float32(inv_height)
                    feat[r, 1] = T.sqrt(raw[r, 0] * raw[r, 0] + raw[r, 1] * raw[r, 1]) * T.float32(
                        inv_range
                    )
                    feat[r, 2] = raw[r, 2] * T.float32(inv_height)
                    feat[r, 3] = raw[r, 3]
                for rb, cb in T.grid(tile // rows, h1 // c1):
                    acc = T.decl_buffer((rows, c1), "float32")
                    for r in T.unroll(rows):
                        for c in T.vectorized(c1):
                            acc[r, c] = b1[cb * c1 + c]
                    for k in T.unroll(FEATURES):
                        for r in T.unroll(rows):
                            for c in T.vectorized(c1):
                                acc[r, c] = acc[r, c] + feat[rb * rows + r, k] * w1[k, cb * c1 + c]
                    for r in T.unroll(rows):
                        for c in T.vectorized(c1):
                            f1[rb * rows + r, cb * c1 + c] = T.max(acc[r, c], T.float32(0))
                for rb in range(tile // rows):
                    part = T.decl_buffer((rows, s_lanes), "float32")
                    logit = T.decl_buffer((rows,), "float32")
                    for r in T.unroll(rows):
                        for c in T.vectorized(s_lanes):
                            part[r, c] = T.float32(0)
                    for cb in range(h2 // c2):
                        acc = T.decl_buffer((rows, c2), "float32")
                        for r in T.unroll(rows):
                            for c in T.vectorized(c2):
                                acc[r, c] = b2[cb * c2 + c]
                        for k in range(h1):
                            for r in T.unroll(rows):
                                for c in T.vectorized(c2):
                                    acc[r, c] = (
                                        acc[r, c] + f1[rb * rows + r, k] * w2[k, cb * c2 + c]
                                    )
                        for r in T.unroll(rows):
                            for j in T.unroll(c2 // s_lanes):
                                for c in T.vectorized(s_lanes):
                                    part[r, c] = (
                                        part[r, c]
                                        + T.max(acc[r, j * s_lanes + c], T.float32(0))
                                        * ws[cb * c2 + j * s_lanes + c, 0]
                                    )
                    for r in T.unroll(rows):
                        logit[r] = bs[0]
                    # Lanes outside, rows inside: one dependency chain per row, interleaved.
                    for c in T.unroll(s_lanes):
                        for r in T.unroll(rows):
                            logit[r] = logit[r] + part[r, c]
                    for r in T.unroll(rows):
                        scores[T.min(t * tile + rb * rows + r, n - 1)] = T.sigmoid(logit[r])

    return point_mlp
