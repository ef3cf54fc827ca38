"""Hand-written TIR kernels (TVMScript) used by the models through ``tensor_ir_op``."""

from __future__ import annotations

import functools

from tvm import tirx
from tvm.script import tirx as T

POINT_WIDTH = 4
GROUND_WIDTH = 4
FEATURES = 4
STEP_FEATURES = 4
# Below this displacement (metres per step) an agent has no heading; the decoder uses +x.
HEADING_EPS_M = 1e-3
# Residuals are in units of the agent's speed plus this floor (metres per step): hypotheses
# spread with the pace, so one fit serves slow crowds and fast walkers, and a standing
# agent's still reach a walking step.
RESIDUAL_FLOOR_M = 0.2
TURN_EPS = 1e-6
# A learned mode other than the top one weighs this share of the top one's weight times its
# softmax ratio to it: below 1, so that the top learned mode stays the likeliest learned one
# and the ranking states which mode the gate speaks of (see ``rank_kernel``).
SPREAD_SHARE = 1.0 / 3.0
# One GPU thread per agent; agents are few (A <= 64), so one block usually holds them all.
GPU_THREADS = 64
# A parallel region costs several microseconds (waking the pool's workers, more when they
# sleep); a loop nest with less work than this many multiply-adds runs serially. The schedule
# rules apply the same threshold at compile time; hand-written kernels test it per call.
MIN_PARALLEL_WORK = 1 << 19
# Independent FMA chains per thread in the peak kernel: latency (4 cycles) times pipes (2) on
# current x86 and Arm cores, with room to spare, and few enough to stay in registers.
FMA_CHAINS = 12


@functools.cache
def point_features_kernel(range_scale: float, height_scale: float) -> object:
    inv_range = 1.0 / range_scale
    inv_height = 1.0 / height_scale

    # Height above the ground plane and range make the score independent of sensor mounting.
    @T.prim_func(private=True, s_tir=True)
    def point_features(
        var_points: T.handle, ground: T.Buffer((GROUND_WIDTH,), "float32"), var_out: T.handle
    ) -> None:
        T.func_attr({"tirx.noalias": True})
        n = T.int64()
        points = T.match_buffer(var_points, (n, POINT_WIDTH), "float32")
        out = T.match_buffer(var_out, (n, FEATURES), "float32")
        for p, j in T.grid(n, FEATURES):
            with T.sblock("features"):
                vp, vj = T.axis.remap("SS", [p, j])
                out[vp, vj] = T.Select(
                    vj == 0,
                    (
                        ground[0] * points[vp, 0]
                        + ground[1] * points[vp, 1]
                        + ground[2] * points[vp, 2]
                        + ground[3]
                    )
                    * T.float32(inv_height),
                    T.Select(
                        vj == 1,
                        T.sqrt(points[vp, 0] * points[vp, 0] + points[vp, 1] * points[vp, 1])
                        * T.float32(inv_range),
                        T.Select(vj == 2, points[vp, 2] * T.float32(inv_height), points[vp, 3]),
                    ),
                )

    return point_features


def anchor_shares(k_hyp: int) -> tuple[float, ...]:
    """Share of constant-velocity motion under each hypothesis's residual.

    Mode 0 is anchored at constant velocity, as are all but the last; the last (where
    K > 1) is anchored at standing still, so that staying put exactly, which a standing
    pedestrian mostly does, is its natural output rather than a residual that must cancel
    its drift to the centimetre.
    """
    return tuple(0.0 if k == k_hyp - 1 and k_hyp > 1 else 1.0 for k in range(k_hyp))


def residual_shares(k_hyp: int) -> tuple[float, ...]:
    """Share of the learned residual in each hypothesis: none in mode 0, which is therefore
    exactly the constant-velocity continuation, whatever the weights."""
    return tuple(0.0 if k == 0 and k_hyp > 1 else 1.0 for k in range(k_hyp))


def _pick(index: object, values: tuple[float, ...]) -> object:
    """``values[index]`` as a float32 TIR expression of a loop variable ``index``."""
    expr = tirx.const(values[-1], "float32")
    for i in range(len(values) - 2, -1, -1):
        expr = tirx.Select(index == i, tirx.const(values[i], "float32"), expr)
    return expr


@functools.cache
def predictor_kernels(
    hd: int, k_hyp: int, horizon: int, gpu: bool = False
) -> tuple[object, object, object, object]:
    """GRU full-sequence and single-step kernels, and hypothesis placement.

    Each kernel's per-agent body is one macro; only the outer loop differs: parallel CPU
    threads, or one GPU thread per agent.
    """
    g3 = 3 * hd
    threads = GPU_THREADS
    # Multiply-adds of one GRU step of one agent, and of placing one agent's hypotheses.
    cell_work = g3 * (STEP_FEATURES + hd)
    place_work = k_hyp * horizon * 2

    # One GRU cell shared by the full-sequence and the single-step kernels, so that
    # incremental encoding performs exactly the same arithmetic as a full recompute.
    @T.macro(hygienic=False)
    def gru_cell(dpx, dpy, dnx, dny):  # type: ignore[no-untyped-def]
        sp = T.sqrt(dnx * dnx + dny * dny)
        sq = T.sqrt(dpx * dpx + dpy * dpy)
        den = sp * sq + T.float32(TURN_EPS)
        f[0] = sp
        f[1] = sq
        f[2] = (dpx * dnx + dpy * dny) / den
        f[3] = (dpx * dny - dpy * dnx) / den
        for g in range(g3):
            gi[g] = b_ih[g]
            gh[g] = b_hh[g]
            for q in range(STEP_FEATURES):
                gi[g] = gi[g] + f[q] * w_ih[q, g]
            for q in range(hd):
                gh[g] = gh[g] + h[q] * w_hh[q, g]
        for j in range(hd):
            r = T.sigmoid(gi[j] + gh[j])
            z = T.sigmoid(gi[hd + j] + gh[hd + j])
            nc = T.tanh(gi[2 * hd + j] + r * gh[2 * hd + j])
            h[j] = (T.float32(1) - z) * nc + z * h[j]

    # The outer loop of every kernel: one GPU thread per agent, or CPU threads when the work
    # pays for a parallel region. A non-hygienic macro sees only its arguments and the names
    # of the prim_func it expands in, so what it needs from here comes in as defaults.
    @T.macro(hygienic=False)
    def each_agent(agent, work, gpu=gpu, threads=threads):  # type: ignore[no-untyped-def]
        if gpu:
            for bx in T.thread_binding(T.ceildiv(a_n, threads), thread="blockIdx.x"):
                for tx in T.thread_binding(threads, thread="threadIdx.x"):
                    if bx * threads + tx < a_n:
                        agent(bx * threads + tx)
        elif work >= MIN_PARALLEL_WORK:
            for a in T.parallel(a_n):
                agent(a)
        else:
            for a in T.serial(a_n):
                agent(a)

    @T.macro(hygienic=False)
    def encode_agent(a, cell=gru_cell):  # type: ignore[no-untyped-def]
        h = T.decl_buffer((hd,), "float32", scope="local")
        gi = T.decl_buffer((g3,), "float32", scope="local")
        gh = T.decl_buffer((g3,), "float32", scope="local")
        f = T.decl_buffer((STEP_FEATURES,), "float32", scope="local")
        d = T.decl_buffer((2,), "float32", scope="local")
        for j in range(hd):
            h[j] = T.float32(0)
        d[0] = T.float32(0)
        d[1] = T.float32(0)
        for t in range(s_n - 1):
            if T.Cast("int64", lens[a]) > t + 1:
                dnx = hist[a, t + 1, 0] - hist[a, t, 0]
                dny = hist[a, t + 1, 1] - hist[a, t, 1]
                cell(d[0], d[1], dnx, dny)
                d[0] = dnx
                d[1] = dny
        for j in range(hd):
            h_out[a, j] = h[j]
        disp_out[a, 0] = d[0]
        disp_out[a, 1] = d[1]
        if s_n > 0:
            last = T.max(T.min(T.Cast("int64", lens[a]), s_n), T.int64(1)) - 1
            pos_out[a, 0] = hist[a, last, 0]
            pos_out[a, 1] = hist[a, last, 1]
        else:
            pos_out[a, 0] = T.float32(0)
            pos_out[a, 1] = T.float32(0)

    @T.prim_func(private=True)
    def gru_encode(
        var_hist: T.handle,
        var_len: T.handle,
        w_ih: T.Buffer((STEP_FEATURES, g3), "float32"),
        w_hh: T.Buffer((hd, g3), "float32"),
        b_ih: T.Buffer((g3,), "float32"),
        b_hh: T.Buffer((g3,), "float32"),
        var_h: T.handle,
        var_pos: T.handle,
        var_disp: T.handle,
    ) -> None:
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        a_n = T.int64()
        s_n = T.int64()
        hist = T.match_buffer(var_hist, (a_n, s_n, 2), "float32")
        lens = T.match_buffer(var_len, (a_n,), "int32")
        h_out = T.match_buffer(var_h, (a_n, hd), "float32")
        pos_out = T.match_buffer(var_pos, (a_n, 2), "float32")
        disp_out = T.match_buffer(var_disp, (a_n, 2), "float32")
        each_agent(encode_agent, a_n * s_n * cell_work)

    @T.macro(hygienic=False)
    def step_agent(a, cell=gru_cell):  # type: ignore[no-untyped-def]
        h = T.decl_buffer((hd,), "float32", scope="local")
        gi = T.decl_buffer((g3,), "float32", scope="local")
        gh = T.decl_buffer((g3,), "float32", scope="local")
        f = T.decl_buffer((STEP_FEATURES,), "float32", scope="local")
        for j in range(hd):
            h[j] = h_in[a, j]
        dnx = new[a, 0] - pos_in[a, 0]
        dny = new[a, 1] - pos_in[a, 1]
        cell(disp_in[a, 0], disp_in[a, 1], dnx, dny)
        for j in range(hd):
            h_out[a, j] = h[j]
        pos_out[a, 0] = new[a, 0]
        pos_out[a, 1] = new[a, 1]
        disp_out[a, 0] = dnx
        disp_out[a, 1] = dny

    @T.prim_func(private=True)
    def gru_step(
        var_h_in: T.handle,
        var_pos_in: T.handle,
        var_disp_in: T.handle,
        var_new: T.handle,
        w_ih: T.Buffer((STEP_FEATURES, g3), "float32"),
        w_hh: T.Buffer((hd, g3), "float32"),
        b_ih: T.Buffer((g3,), "float32"),
        b_hh: T.Buffer((g3,), "float32"),
        var_h: T.handle,
        var_pos: T.handle,
        var_disp: T.handle,
    ) -> None:
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        a_n = T.int64()
        h_in = T.match_buffer(var_h_in, (a_n, hd), "float32")
        pos_in = T.match_buffer(var_pos_in, (a_n, 2), "float32")
        disp_in = T.match_buffer(var_disp_in, (a_n, 2), "float32")
        new = T.match_buffer(var_new, (a_n, 2), "float32")
        h_out = T.match_buffer(var_h, (a_n, hd), "float32")
        pos_out = T.match_buffer(var_pos, (a_n, 2), "float32")
        disp_out = T.match_buffer(var_disp, (a_n, 2), "float32")
        each_agent(step_agent, a_n * cell_work)

    @T.macro(hygienic=False)
    def place_agent(a):  # type: ignore[no-untyped-def]
        speed = T.sqrt(disp[a, 0] * disp[a, 0] + disp[a, 1] * disp[a, 1])
        moving = speed > T.float32(HEADING_EPS_M)
        c = T.if_then_else(
            moving, disp[a, 0] / T.max(speed, T.float32(HEADING_EPS_M)), T.float32(1)
        )
        s = T.if_then_else(
            moving, disp[a, 1] / T.max(speed, T.float32(HEADING_EPS_M)), T.float32(0)
        )
        scale = speed + T.float32(RESIDUAL_FLOOR_M)
        for k, step in T.grid(k_hyp, horizon):
            anchor = speed * T.Cast("float32", step + 1) * _pick(k, anchor_shares(k_hyp))
            learned = scale * _pick(k, residual_shares(k_hyp))
            u = anchor + learned * res[a, (k * horizon + step) * 2]
            v = learned * res[a, (k * horizon + step) * 2 + 1]
            out[a, k, step, 0] = pos[a, 0] + c * u - s * v
            out[a, k, step, 1] = pos[a, 1] + s * u + c * v

    # Hypotheses are an anchor (constant velocity, or standing still: anchor_shares) plus a
    # learned residual, both in the agent's heading frame, so the decoder is invariant to
    # where and which way an agent walks; the residual scales with the pace
    # (RESIDUAL_FLOOR_M).
    @T.prim_func(private=True)
    def place_hypotheses(
        var_res: T.handle, var_pos: T.handle, var_disp: T.handle, var_out: T.handle
    ) -> None:
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        a_n = T.int64()
        res = T.match_buffer(var_res, (a_n, k_hyp * horizon * 2), "float32")
        pos = T.match_buffer(var_pos, (a_n, 2), "float32")
        disp = T.match_buffer(var_disp, (a_n, 2), "float32")
        out = T.match_buffer(var_out, (a_n, k_hyp, horizon, 2), "float32")
        each_agent(place_agent, a_n * place_work)

    # Packed histories: agent a's steps are rows [start_a, start_a + len_a) of one [S, 2]
    # array, so a batch costs its real steps, not A x T_max.
    @T.macro(hygienic=False)
    def encode_packed_agent(a, cell=gru_cell):  # type: ignore[no-untyped-def]
        h = T.decl_buffer((hd,), "float32", scope="local")
        gi = T.decl_buffer((g3,), "float32", scope="local")
        gh = T.decl_buffer((g3,), "float32", scope="local")
        f = T.decl_buffer((STEP_FEATURES,), "float32", scope="local")
        d = T.decl_buffer((2,), "float32", scope="local")
        start = T.decl_buffer((1,), "int64", scope="local")
        start[0] = T.int64(0)
        for b in range(a):
            start[0] = start[0] + T.Cast("int64", lens[b])
        for j in range(hd):
            h[j] = T.float32(0)
        d[0] = T.float32(0)
        d[1] = T.float32(0)
        for t in range(T.Cast("int64", lens[a]) - 1):
            dnx = points[start[0] + t + 1, 0] - points[start[0] + t, 0]
            dny = points[start[0] + t + 1, 1] - points[start[0] + t, 1]
            cell(d[0], d[1], dnx, dny)
            d[0] = dnx
            d[1] = dny
        for j in range(hd):
            h_out[a, j] = h[j]
        disp_out[a, 0] = d[0]
        disp_out[a, 1] = d[1]
        last = start[0] + T.Cast("int64", lens[a]) - 1
        pos_out[a, 0] = points[last, 0]
        pos_out[a, 1] = points[last, 1]

    @T.prim_func(private=True)
    def gru_encode_packed(
        var_points: T.handle,
        var_len: T.handle,
        w_ih: T.Buffer((STEP_FEATURES, g3), "float32"),
        w_hh: T.Buffer((hd, g3), "float32"),
        b_ih: T.Buffer((g3,), "float32"),
        b_hh: T.Buffer((g3,), "float32"),
        var_h: T.handle,
        var_pos: T.handle,
        var_disp: T.handle,
    ) -> None:
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        a_n = T.int64()
        s_n = T.int64()
        points = T.match_buffer(var_points, (s_n, 2), "float32")
        lens = T.match_buffer(var_len, (a_n,), "int32")
        h_out = T.match_buffer(var_h, (a_n, hd), "float32")
        pos_out = T.match_buffer(var_pos, (a_n, 2), "float32")
        disp_out = T.match_buffer(var_disp, (a_n, 2), "float32")
        each_agent(encode_packed_agent, s_n * cell_work)

    return gru_encode, gru_step, place_hypotheses, gru_encode_packed


@functools.cache
def rank_kernel(k_hyp: int, gpu: bool = False) -> object:
    """Probabilities ``[A, K]`` from the confidence logits ``[A, K]`` and the gate ``[A, 1]``.

    The top learned mode is the one of modes 1.. whose logit is highest (the first of equals).
    The gate is the calibrated probability g that it beats mode 0 (constant velocity). Before
    normalising, mode 0 weighs 1 - g, the top learned mode g, and each other learned mode g / 3
    times its softmax share relative to the top one's. So the top-ranked mode is always mode 0
    or the top learned mode, the latter exactly where g > 0.5; the top learned mode is always
    the likeliest of the learned ones, and p_top / (p0 + p_top) states g. Mode 0's own logit
    takes no part.
    """
    threads = GPU_THREADS

    @T.macro(hygienic=False)
    def each_agent(agent, gpu=gpu, threads=threads):  # type: ignore[no-untyped-def]
        if gpu:
            for bx in T.thread_binding(T.ceildiv(a_n, threads), thread="blockIdx.x"):
                for tx in T.thread_binding(threads, thread="threadIdx.x"):
                    if bx * threads + tx < a_n:
                        agent(bx * threads + tx)
        else:
            for a in T.serial(a_n):
                agent(a)

    @T.macro(hygienic=False)
    def rank_agent(a):  # type: ignore[no-untyped-def]
        if k_hyp == 1:
            out[a, 0] = T.float32(1)
        else:
            acc = T.decl_buffer((3,), "float32", scope="local")
            top = T.decl_buffer((1,), "int32", scope="local")
            acc[0] = logits[a, 1]
            top[0] = 1
            for k in range(2, k_hyp):
                if logits[a, k] > acc[0]:
                    acc[0] = logits[a, k]
                    top[0] = k
            g = T.sigmoid(gate[a, 0])
            acc[1] = T.float32(0)
            for k in range(1, k_hyp):
                if k != top[0]:
                    out[a, k] = g * T.exp(logits[a, k] - acc[0]) * T.float32(SPREAD_SHARE)
                    acc[1] = acc[1] + out[a, k]
            acc[2] = T.float32(1) / (T.float32(1) + acc[1])
            for k in range(1, k_hyp):
                if k != top[0]:
                    out[a, k] = out[a, k] * acc[2]
            out[a, 0] = (T.float32(1) - g) * acc[2]
            out[a, top[0]] = g * acc[2]

    @T.prim_func(private=True)
    def rank_hypotheses(var_logits: T.handle, var_gate: T.handle, var_out: T.handle) -> None:
        T.func_attr({"tirx.noalias": True, "tirx.is_scheduled": True})
        a_n = T.int64()
        logits = T.match_buffer(var_logits, (a_n, k_hyp), "float32")
        gate = T.match_buffer(var_gate, (a_n, 1), "float32")
        out = T.match_buffer(var_out, (a_n, k_hyp), "float32")
        each_agent(rank_agent)

    return rank_hypotheses


def fma_peak_kernel(threads: int, lanes: int, iterations: int) -> tirx.PrimFunc:
    """``threads`` parallel loops of ``FMA_CHAINS`` vector FMA chains, ``iterations`` deep."""

    @T.prim_func
    def fma_peak(
        out: T.Buffer((threads, FMA_CHAINS, lanes), "float32"), scale: T.Buffer((lanes,), "float32")
    ) -> None:
        T.func_attr({"global_symbol": "fma_peak", "tirx.noalias": True})
        for t in T.parallel(threads):
            acc = T.decl_buffer((FMA_CHAINS, lanes), "float32")
            for i in T.unroll(FMA_CHAINS):
                for c in T.vectorized(lanes):
                    acc[i, c] = T.float32(1)
            for _ in range(iterations):
                for i in T.unroll(FMA_CHAINS):
                    for c in T.vectorized(lanes):
                        acc[i, c] = acc[i, c] * scale[c] + T.float32(1e-9)
            for i in T.unroll(FMA_CHAINS):
                for c in T.vectorized(lanes):
                    out[t, i, c] = acc[i, c]

    return fma_peak
