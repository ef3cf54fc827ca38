"""The prediction stage of the nodes and replay: per-track GRU state, speculation, counters."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Generator, Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dynshape_perception.errors import InputValueError, ShapeError
from dynshape_perception.perception.pipeline import ModelFn, Pose2D
from dynshape_perception.perception.prediction.incremental import (
    Histories,
    Prediction,
    full_recompute,
)
from dynshape_perception.perception.prediction.paths import PredictedPaths, prediction_table
from dynshape_perception.perception.prediction.settings import PredictionSettings
from dynshape_perception.perception.prediction.speculative import (
    SpeculativePredictor,
    run_to_end,
    snap,
)
from dynshape_perception.perception.records import PREDICTION_DTYPE
from dynshape_perception.stats import DIGITS, median

# The grid is anchored this share of a grid step before the first frame: a later frame may
# come that much early (stamp jitter) and still land on its own grid point.
ANCHOR_LEAD = 0.25
MS_PER_S = 1000.0
# Critical-path timings kept for the saved-latency estimate (a node runs for days).
TIMING_WINDOW = 1000
# Sample rows a track starts with (at 10 Hz, 6 s); the buffer doubles as needed.
SAMPLES_CAPACITY = 64


@dataclass(frozen=True)
class StageOutput:
    """Predicted paths ``[A, K, H, 2]`` and their confidences ``[A, K]``, nearest agent first.

    ``reference_s`` is the grid time the histories end at (at most one grid step before the
    frame; None before any), the first predicted step lies one predictor step after it.
    """

    ids: np.ndarray
    traj: np.ndarray
    probs: np.ndarray
    reference_s: float | None
    computed: bool

    def table(self) -> np.ndarray:
        if self.ids.size == 0:
            return np.zeros(0, dtype=PREDICTION_DTYPE)
        return prediction_table(self.ids, self.traj, self.probs)

    def paths(self, step_s: float) -> PredictedPaths:
        """As the object messages take them."""
        if self.ids.size == 0:
            return PredictedPaths.empty(step_s)
        return PredictedPaths(self.ids, self.traj, self.probs, step_s)


def _empty_output(reference_s: float | None, computed: bool) -> StageOutput:
    return StageOutput(
        np.zeros(0, np.uint32),
        np.zeros((0, 0, 0, 2), np.float32),
        np.zeros((0, 0), np.float32),
        reference_s,
        computed,
    )


def _between(t: float, t0: float, t1: float, v0: float, v1: float) -> float:
    """np.interp's value at ``t0 < t < t1``, in its order of operations."""
    slope = (v1 - v0) / (t1 - t0)
    v = slope * (t - t0) + v0
    if math.isnan(v):
        # As np.interp: from the other end, then the value itself where the two agree.
        v = slope * (t - t1) + v1
        if math.isnan(v) and v0 == v1:
            v = v0
    return v


class _Samples:
    """One track's positions as received, oldest first; old ones are trimmed as they age out.

    Rows ``(stamp, x, y)`` live in a buffer that doubles when full, between ``start`` and
    ``end``: appending and trimming move no rows but on a rare compaction.
    """

    __slots__ = ("buf", "end", "first_s", "first_tick", "start")

    def __init__(self) -> None:
        self.buf = np.empty((SAMPLES_CAPACITY, 3), np.float64)
        self.start = 0
        self.end = 0
        self.first_s = math.inf
        # The first grid point at or after first_s: predictor steps count from it.
        self.first_tick = 0

    @property
    def newest_s(self) -> float:
        return float(self.buf[self.end - 1, 0])

    def append(self, stamp_s: float, x: float, y: float) -> None:
        if self.end == 0:
            self.first_s = stamp_s
        if self.end == self.buf.shape[0]:
            live = self.end - self.start
            if live * 2 > self.buf.shape[0]:
                grown = np.empty((self.buf.shape[0] * 2, 3), np.float64)
                grown[:live] = self.buf[self.start : self.end]
                self.buf = grown
            else:
                self.buf[:live] = self.buf[self.start : self.end]
            self.start, self.end = 0, live
        self.buf[self.end] = (stamp_s, x, y)
        self.end += 1

    def trim(self, cutoff_s: float) -> None:
        """Keep the newest sample at or before ``cutoff_s`` and every later one."""
        buf, start = self.buf, self.start
        # A sample or two age out a frame: stepping over them costs less than a search.
        while start + 1 < self.end and buf[start + 1, 0] <= cutoff_s:
            start += 1
        self.start = start

    def at(self, times: np.ndarray) -> np.ndarray:
        """Positions at ``times`` (inside the recorded span, oldest first), float32 ``[n, 2]``.

        Interpolated over the samples from the newest at or before the oldest time: the
        values equal those over the whole track (``resample_history``; interpolation reads
        the two samples around a time only), at a cost that does not grow with its age.
        """
        stamps = self.buf[self.start : self.end, 0]
        first = self.start + max(int(np.searchsorted(stamps, times[0], side="right")) - 1, 0)
        window = self.buf[first : self.end]
        out = np.empty((times.size, 2), np.float32)
        out[:, 0] = np.interp(times, window[:, 0], window[:, 1])
        out[:, 1] = np.interp(times, window[:, 0], window[:, 2])
        return out

    def at_one(self, time_s: float) -> tuple[float, float]:
        """``at`` of one time, with np.interp's arithmetic in Python floats: every frame
        asks this of every agent, and the NumPy calls of ``at`` cost many times the sums."""
        buf = self.buf
        j = self.end - 1
        newest = buf[j].tolist()
        # At or after the newest sample, or NaN: ``at`` gives the newest for either.
        if not time_s < newest[0]:
            return newest[1], newest[2]
        j -= 1
        while j >= self.start and buf[j, 0] > time_s:
            j -= 1
        if j < self.start:
            first = buf[self.start].tolist()
            return first[1], first[2]
        t0, x0, y0 = buf[j].tolist()
        if t0 == time_s:
            return x0, y0
        t1, x1, y1 = buf[j + 1].tolist()
        return _between(time_s, t0, t1, x0, x1), _between(time_s, t0, t1, y0, y1)


@dataclass
class StageCounters:
    frames: int = 0
    # Frames on the grid point of the frame before: its output is given again.
    frames_reused: int = 0
    agents: int = 0
    agents_dropped: int = 0
    resets: int = 0
    forward_calls: int = 0
    # Agents predicted by forward (full mode).
    forwarded: int = 0
    predict_ms: deque[float] = field(default_factory=lambda: deque(maxlen=TIMING_WINDOW))
    # Critical-path time of incremental frames with and without a promoted speculation.
    promoted_ms: deque[float] = field(default_factory=lambda: deque(maxlen=TIMING_WINDOW))
    stepped_ms: deque[float] = field(default_factory=lambda: deque(maxlen=TIMING_WINDOW))


class PredictionStage:
    """Track tables in, predicted paths and confidences out; the state of every track kept.

    Histories are sampled on a grid of ``grid_s = step_s / phases``, anchored at the first
    frame: a frame predicts from the positions at its grid point and at every predictor
    step before it, interpolated from the positions the tables gave (never extrapolated).
    Each of the ``phases`` grid points of a predictor step has its own incremental
    predictor, so that every grid point a frame lands on advances one of them by one
    ``step_decode`` call over its continuing tracks, whatever their history length. New
    tracks are encoded from their history; a track missing from a table is forgotten and
    evicted; a stamp before the newest resets everything. ``mode="full"`` runs ``forward``
    over every history instead (the reference the incremental path equals).

    Histories never slide: a window that drops its oldest step every frame would need a
    forward pass over the window every frame, since a recurrent state cannot forget a
    step. Instead a history past the window (``history_steps``) restarts from an anchor
    ``stride`` steps later (``PredictionSettings.history_length``), in both modes, and the
    chain encodes that track once from the restarted history (its ``slid`` count); between
    restarts the track takes its one step per frame. Both modes see the same histories,
    no history is longer than ``history_steps`` (the bound the predictor is compiled and
    fitted for), and tracks born at different times restart on different frames.

    Positions are snapped to ``quantum_m`` in every mode, so that speculation (verified
    exactly on snapped positions) never changes an output.
    """

    def __init__(self, predictor: ModelFn, settings: PredictionSettings | None = None) -> None:
        self.settings = settings or PredictionSettings()
        self._predictor = predictor
        self._lock = threading.Lock()
        self.counters = StageCounters()
        self._chains: list[SpeculativePredictor] = []
        # Counts of the chains that a reset replaced.
        self._retired: dict[str, int] = {}
        self._log: dict[int, _Samples] = {}
        self._anchor_s: float | None = None
        self._tick: int | None = None
        self._last_stamp_s = -math.inf
        self._last: StageOutput | None = None
        self._build_chains()

    def _build_chains(self) -> None:
        s = self.settings
        for key, value in _chain_counts(self._chains).items():
            self._retired[key] = self._retired.get(key, 0) + value
        self._chains = [
            SpeculativePredictor(
                self._predictor,
                s.speculation_config(),
                max_batch=s.max_agents,
                # A state at the window is encoded afresh from its restarted history.
                max_history=s.history_steps,
            )
            for _ in range(s.phases)
        ]

    # -- control ----------------------------------------------------------------------
    def reset(self) -> None:
        """Forget every track and the grid (a time jump, a new fixed frame)."""
        with self._lock:
            self._reset_locked()

    def _reset_locked(self) -> None:
        self._log.clear()
        self._anchor_s = None
        self._tick = None
        self._last_stamp_s = -math.inf
        self._last = None
        self._build_chains()
        self.counters.resets += 1

    def update_settings(self, settings: PredictionSettings) -> None:
        """Live change: the mode and speculation switch in place; the grid restarts."""
        with self._lock:
            self.settings = settings
            self._reset_locked()

    def evict(self, ids: Iterable[int]) -> int:
        """Forget tracks that died (their states in every chain); returns how many were known."""
        gone = {int(i) for i in ids}
        with self._lock:
            known = len(gone & self._log.keys())
            for track_id in gone:
                self._log.pop(track_id, None)
            for chain in self._chains:
                chain.evict(gone)
        return known

    # -- the frame ----------------------------------------------------------------------
    def predict(self, tracks: np.ndarray, stamp_s: float, ego: Pose2D | None = None) -> StageOutput:
        """This frame's predictions of ``tracks`` (rows with ``id``, ``x``, ``y``, fixed frame)."""
        started = time.perf_counter()
        ids, xs, ys = self._check(tracks, stamp_s)
        ego = ego or Pose2D()
        with self._lock:
            if stamp_s < self._last_stamp_s:
                self._reset_locked()
            self._record(ids, xs, ys, stamp_s)
            tick = self._tick_of(stamp_s)
            if self._tick is not None and tick == self._tick and self._last is not None:
                output = self._reuse(self._last)
                self.counters.frames_reused += 1
            else:
                output = self._compute(tick, ids, xs, ys, ego)
            self._tick = tick
            self._last = output
            self._last_stamp_s = stamp_s
            self.counters.frames += 1
            self.counters.agents += int(output.ids.size)
            self.counters.predict_ms.append((time.perf_counter() - started) * MS_PER_S)
        return output

    @staticmethod
    def _check(tracks: np.ndarray, stamp_s: float) -> tuple[list[int], list[float], list[float]]:
        names = getattr(getattr(tracks, "dtype", None), "names", None) or ()
        if not {"id", "x", "y"} <= set(names) or tracks.ndim != 1:
            raise ShapeError("tracks must be a 1-D table with id, x and y fields")
        if not (isinstance(stamp_s, (int, float)) and math.isfinite(stamp_s)):
            raise InputValueError(f"track stamp {stamp_s!r} is not a finite number of seconds")
        if not (np.isfinite(tracks["x"]).all() and np.isfinite(tracks["y"]).all()):
            raise InputValueError("a track position holds NaN or Inf")
        ids = [int(i) for i in tracks["id"].tolist()]
        if len(set(ids)) != len(ids):
            raise InputValueError("track ids repeat within one table")
        xs = [float(v) for v in tracks["x"].tolist()]
        ys = [float(v) for v in tracks["y"].tolist()]
        return ids, xs, ys

    def _record(self, ids: list[int], xs: list[float], ys: list[float], stamp_s: float) -> None:
        """Append this table's positions; ids missing from it are forgotten."""
        live = set(ids)
        gone = [i for i in self._log if i not in live]
        for track_id in gone:
            del self._log[track_id]
        if gone:
            # Its id may come back with a new history: no chain may step its old state.
            for chain in self._chains:
                chain.evict(gone)
        s = self.settings
        if self._anchor_s is None:
            self._anchor_s = stamp_s - ANCHOR_LEAD * s.grid_s
        # The oldest grid time any later frame samples: one grid step before this frame,
        # then back history_steps - 1 predictor steps.
        cutoff = stamp_s - s.grid_s - (s.history_steps - 1) * s.step_s
        for track_id, x, y in zip(ids, xs, ys, strict=True):
            samples = self._log.get(track_id)
            if samples is None:
                samples = self._log[track_id] = _Samples()
                samples.first_tick = self._first_tick(stamp_s)
            elif samples.newest_s == stamp_s:
                continue
            samples.append(stamp_s, x, y)
            samples.trim(cutoff)

    def _grid_time(self, tick: int | np.ndarray) -> np.ndarray:
        assert self._anchor_s is not None
        return self._anchor_s + np.asarray(tick, np.float64) * self.settings.grid_s

    def _first_tick(self, stamp_s: float) -> int:
        """The first grid point at or after ``stamp_s``."""
        assert self._anchor_s is not None
        tick = math.ceil((stamp_s - self._anchor_s) / self.settings.grid_s)
        # As the lengths count grid times: float error may put the quotient either side.
        while float(self._grid_time(tick - 1)) >= stamp_s:
            tick -= 1
        while float(self._grid_time(tick)) < stamp_s:
            tick += 1
        return tick

    def _tick_of(self, stamp_s: float) -> int:
        assert self._anchor_s is not None
        tick = math.floor((stamp_s - self._anchor_s) / self.settings.grid_s)
        # Float error must never put the grid point after the frame (it would extrapolate).
        while float(self._grid_time(tick)) > stamp_s:
            tick -= 1
        return tick

    def _reuse(self, last: StageOutput) -> StageOutput:
        keep = np.fromiter((int(i) in self._log for i in last.ids.tolist()), bool, last.ids.size)
        return StageOutput(
            last.ids[keep], last.traj[keep], last.probs[keep], last.reference_s, False
        )

    def _agents(
        self, tick: int, ids: list[int], xs: list[float], ys: list[float], ego: Pose2D
    ) -> tuple[list[int], list[int]]:
        """The agents observed at ``tick``'s grid time with enough history, nearest first
        (at most ``max_agents``), and their anchored history lengths."""
        s = self.settings
        end = float(self._grid_time(tick))
        dist = np.hypot(np.asarray(xs) - ego.x, np.asarray(ys) - ego.y)
        agents: list[int] = []
        lengths: list[int] = []
        for row in np.argsort(dist, kind="stable").tolist():
            samples = self._log[ids[row]]
            if not samples.first_s <= end <= samples.newest_s:
                continue
            length = s.history_length((tick - samples.first_tick) // s.phases + 1)
            if length < s.min_history_steps:
                continue
            agents.append(ids[row])
            lengths.append(length)
        if len(agents) > s.max_agents:
            self.counters.agents_dropped += len(agents) - s.max_agents
            agents, lengths = agents[: s.max_agents], lengths[: s.max_agents]
        return agents, lengths

    def _histories(
        self, track_ids: Sequence[int], tick: int, length_of: Mapping[int, int]
    ) -> tuple[np.ndarray, np.ndarray]:
        """Each of ``track_ids``' snapped positions at its ``length_of`` grid times one
        predictor step apart, ending at ``tick``'s, oldest first; concatenated, with their
        lengths: the grid times computed once, the snapping done once."""
        s = self.settings
        lengths = np.fromiter((length_of[i] for i in track_ids), np.int64, len(track_ids))
        longest = int(lengths.max(initial=0))
        times = self._grid_time(tick - s.phases * np.arange(longest - 1, -1, -1))
        parts = [
            self._log[i].at(times[longest - n :])
            for i, n in zip(track_ids, lengths.tolist(), strict=True)
        ]
        flat = np.concatenate(parts) if parts else np.zeros((0, 2), np.float32)
        return snap(flat, s.quantum_m)[1], lengths

    def _compute(
        self, tick: int, ids: list[int], xs: list[float], ys: list[float], ego: Pose2D
    ) -> StageOutput:
        s = self.settings
        agents, lengths = self._agents(tick, ids, xs, ys, ego)
        reference = float(self._grid_time(tick))
        if not agents:
            # The chain of this grid point still learns that its tracks are gone.
            if s.mode == "incremental":
                chain = self._chains[tick % s.phases]
                chain.evict(chain.encoder.ids())
            return _empty_output(reference, True)
        length_of = dict(zip(agents, lengths, strict=True))
        if s.mode == "full":
            prediction = self._forward(tick, agents, length_of)
        else:
            prediction = self._incremental(tick, agents, length_of)
        return StageOutput(
            np.asarray(agents, np.uint32), prediction.traj, prediction.probs, reference, True
        )

    def _forward(self, tick: int, agents: list[int], length_of: dict[int, int]) -> Prediction:
        s = self.settings
        flat, lengths = self._histories(agents, tick, length_of)
        histories = np.split(flat, np.cumsum(lengths)[:-1])
        self.counters.forward_calls += math.ceil(len(agents) / s.max_agents)
        self.counters.forwarded += len(agents)
        return full_recompute(self._predictor, np.asarray(agents), histories, s.max_agents)

    def _incremental(self, tick: int, agents: list[int], length_of: dict[int, int]) -> Prediction:
        s = self.settings
        chain = self._chains[tick % s.phases]
        end = float(self._grid_time(tick))
        positions = np.array([self._log[a].at_one(end) for a in agents], np.float32)

        def histories_of(track_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
            return self._histories(track_ids, tick, length_of)

        promoted_before = chain.stats.promoted_frames if s.speculation else 0
        called = time.perf_counter()
        prediction = chain.observe(
            tick // s.phases, np.asarray(agents, np.int64), positions, Histories(histories_of)
        )
        ms = (time.perf_counter() - called) * MS_PER_S
        if s.speculation:
            promoted = chain.stats.promoted_frames > promoted_before
            (self.counters.promoted_ms if promoted else self.counters.stepped_ms).append(ms)
        return prediction

    # -- idle time ----------------------------------------------------------------------
    def speculate_chunks(self) -> Generator[None, None, int]:
        """Precompute the next grid point's likeliest observations (one call per chunk);
        returns the candidates computed (0 when speculation is off or nothing is known)."""
        with self._lock:
            s = self.settings
            if not s.speculation or s.mode != "incremental" or self._tick is None:
                return 0
            chain = self._chains[(self._tick + 1) % s.phases]
        return (yield from chain.speculate_chunks())

    def speculate(self) -> int:
        """``speculate_chunks`` run to the end on the calling thread."""
        return run_to_end(self.speculate_chunks())

    # -- diagnostics ----------------------------------------------------------------------
    def diagnostics(self) -> dict[str, float | int | str | bool]:
        """Counters of every chain (incremental and speculation) and of the stage."""
        with self._lock:
            s = self.settings
            counts = dict(self._retired)
            for key, value in _chain_counts(self._chains).items():
                counts[key] = counts.get(key, 0) + value
            c = self.counters
            predict = np.asarray(c.predict_ms, np.float64)
            promoted = np.asarray(c.promoted_ms, np.float64)
            stepped = np.asarray(c.stepped_ms, np.float64)
            out: dict[str, float | int | str | bool] = {
                "mode": s.mode,
                "frames": c.frames,
                "frames_reused": c.frames_reused,
                "agents": c.agents,
                "agents_dropped": c.agents_dropped,
                "resets": c.resets,
                "forward_calls": c.forward_calls,
                "forwarded": c.forwarded,
                "predict_p50_ms": round(median(predict), DIGITS) if predict.size else 0.0,
                "speculation": s.speculation,
            }
        verified, accepted = counts.pop("verified"), counts.pop("accepted")
        # What a promoted frame saved: the median critical path of frames that stepped less
        # that of frames that were promoted, signed (below 0: promotion cost time); only
        # measured once both kinds were seen, and 0 until then.
        measured = bool(promoted.size and stepped.size)
        saved = median(stepped) - median(promoted) if measured else 0.0
        promoted_frames = counts.pop("promoted_frames")
        candidates = counts.pop("candidates")
        out.update(counts)
        out.update(
            {
                "speculation.verified": verified,
                "speculation.accepted": accepted,
                "speculation.acceptance_rate": round(accepted / verified, 4) if verified else 0.0,
                "speculation.promoted_frames": promoted_frames,
                "speculation.candidates": candidates,
                "speculation.saved_measured": measured,
                "speculation.saved_ms_per_promoted_frame": round(saved, 3),
                "speculation.saved_ms_total": round(saved * promoted_frames, 3),
            }
        )
        return out


def speculation_summary(values: Mapping[str, object]) -> str:
    """One line on speculation from ``diagnostics()``: what it saved, or why nothing."""
    if not values["speculation"]:
        return "speculation off"
    if values["mode"] != "incremental":
        return "speculation idle: it runs in incremental mode only"
    verified = int(str(values["speculation.verified"]))
    if not verified:
        return "speculation on: no observation verified yet, no latency saved"
    accepted = int(str(values["speculation.accepted"]))
    head = f"acceptance {accepted}/{verified}"
    promoted = int(str(values["speculation.promoted_frames"]))
    if not promoted:
        return f"{head}, no frame promoted: no latency saved"
    if not values["speculation.saved_measured"]:
        return f"{head}, {promoted} frame(s) promoted: saved latency not measured yet"
    saved = float(str(values["speculation.saved_ms_per_promoted_frame"]))
    if saved <= 0.0:
        return f"{head}: promoted frames took {-saved:.3f} ms longer, no latency saved"
    return (
        f"{head}: {saved:.3f} ms saved per promoted frame, "
        f"{float(str(values['speculation.saved_ms_total'])):.3f} ms in all"
    )


def _chain_counts(chains: Iterable[SpeculativePredictor]) -> dict[str, int]:
    """The summed model-call and speculation counts of ``chains``."""
    counts = dict.fromkeys(_CHAIN_KEYS, 0)
    for chain in chains:
        enc = chain.encoder.counters
        st = chain.stats
        for key, value in (
            ("step_decode_calls", enc.step_decode_calls),
            ("encode_calls", enc.encode_calls),
            ("decode_calls", enc.decode_calls),
            ("stepped", enc.stepped),
            ("encoded", enc.encoded),
            ("slid", enc.slid),
            ("evicted", enc.evicted),
            ("verified", st.verified),
            ("accepted", st.accepted),
            ("promoted_frames", st.promoted_frames),
            ("candidates", st.candidates),
        ):
            counts[key] += value
    return counts


_CHAIN_KEYS = (
    "step_decode_calls",
    "encode_calls",
    "decode_calls",
    "stepped",
    "encoded",
    "slid",
    "evicted",
    "verified",
    "accepted",
    "promoted_frames",
    "candidates",
)


class IdleSpeculation:
    """A stage's speculation on a thread of its own, for a node without the tiered executor.

    After each frame (``frame_done``) the thread speculates the next grid point one chunk
    (one ``step_decode`` call) at a time; a newer frame ends a speculation it overtook,
    whose result the stage would discard anyway.
    """

    def __init__(self, stage: PredictionStage) -> None:
        self.stage = stage
        self._cv = threading.Condition()
        self._pending = False
        self._busy = False
        self._closed = False
        self.runs = 0
        self.abandoned = 0
        self._thread = threading.Thread(target=self._serve, name="speculation", daemon=True)
        self._thread.start()

    def frame_done(self) -> None:
        with self._cv:
            self._pending = True
            self._cv.notify_all()

    def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no speculation is asked for or running; False on timeout."""
        with self._cv:
            return self._cv.wait_for(lambda: not (self._pending or self._busy), timeout_s)

    def close(self, timeout_s: float = 5.0) -> None:
        with self._cv:
            self._closed = True
            self._cv.notify_all()
        self._thread.join(timeout_s)

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self._pending and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                self._pending = False
                self._busy = True
            try:
                self._speculate()
            finally:
                with self._cv:
                    self._busy = False
                    self._cv.notify_all()

    def _speculate(self) -> None:
        chunks = self.stage.speculate_chunks()
        self.runs += 1
        for _ in chunks:
            with self._cv:
                overtaken = self._pending or self._closed
            if overtaken:
                chunks.close()
                self.abandoned += 1
                return
