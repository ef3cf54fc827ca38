"""Incremental history encoding: per-track predictor state, one batched GRU step per tick."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from dynshape_perception.config import default_bounds
from dynshape_perception.errors import ConfigError, InputValueError, ShapeError
from dynshape_perception.perception.prediction.history import (
    detect_frame_step,
    pack_histories,
    pad_histories,
    resample_history,
)
from dynshape_perception.perception.tracking import Tracker

ModelFn = Callable[..., list[np.ndarray]]
# Track id -> its positions [L, 2] on the tick grid, oldest first, ending at this tick.
HistoryFn = Callable[[int], np.ndarray]


@dataclass(frozen=True)
class Histories:
    """The histories of many tracks at once, where ``HistoryFn`` gives one.

    ``of(ids)`` returns their positions concatenated (``[sum L, 2]``, each track's oldest
    first, in the order of ``ids``) and each one's length ``L``. A frame in which many
    tracks are new (a crowd comes into view) then builds their histories in a few array
    operations, where one call per track costs a few dozen small ones each.
    """

    of: Callable[[Sequence[int]], tuple[np.ndarray, np.ndarray]]


HistorySource = HistoryFn | Histories


def gather_histories(source: HistorySource, ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
    """The histories of ``ids``: rows ``[sum L, 2]`` (the source's dtype) and int64 lengths."""
    if isinstance(source, Histories):
        flat, lengths = (np.asarray(a) for a in source.of(ids))
        if lengths.shape != (len(ids),) or (lengths < 1).any():
            raise ShapeError(f"histories of {len(ids)} tracks need as many lengths >= 1")
        if flat.ndim != 2 or flat.shape != (int(lengths.sum()), 2):
            raise ShapeError(f"histories must be [{int(lengths.sum())}, 2], got {flat.shape}")
        return flat, lengths.astype(np.int64)
    parts = []
    for track_id in ids:
        history = np.asarray(source(track_id))
        if history.ndim != 2 or history.shape[1] != 2 or history.shape[0] < 1:
            raise ShapeError(f"history of track {track_id} must be [L>=1, 2], got {history.shape}")
        parts.append(history)
    lengths = np.fromiter((len(part) for part in parts), np.int64, len(parts))
    return (np.concatenate(parts) if parts else np.zeros((0, 2), np.float32)), lengths


def owner(lengths: np.ndarray, row: int) -> int:
    """Which history of ``lengths`` (concatenated) row ``row`` belongs to."""
    return int(np.searchsorted(np.cumsum(lengths), row, side="right"))


@dataclass(frozen=True)
class AgentState:
    """Predictor state of the agents ``ids`` (rows aligned): the outputs of ``encode``."""

    ids: np.ndarray
    hidden: np.ndarray
    last_pos: np.ndarray
    last_disp: np.ndarray


@dataclass(frozen=True)
class Prediction:
    ids: np.ndarray
    traj: np.ndarray
    probs: np.ndarray


@dataclass
class EncoderCounters:
    step_calls: int = 0
    step_decode_calls: int = 0
    encode_calls: int = 0
    decode_calls: int = 0
    stepped: int = 0
    encoded: int = 0
    installed: int = 0
    evicted: int = 0
    # Continuing tracks encoded afresh because their history slid past max_history.
    slid: int = 0

    @property
    def calls(self) -> int:
        """Model calls made, of every kind."""
        return self.step_calls + self.step_decode_calls + self.encode_calls + self.decode_calls


@dataclass(frozen=True)
class Promoted:
    """Ready next-tick outputs for some agents of a tick (a verified speculation).

    ``rows`` index the tick's ``ids``; the other arrays are aligned with ``rows``: the state
    that ``step`` gives on the agent's observation, and what ``decode`` gives on that state.
    """

    rows: np.ndarray
    hidden: np.ndarray
    last_pos: np.ndarray
    last_disp: np.ndarray
    traj: np.ndarray
    probs: np.ndarray


def _batches(count: int, size: int) -> Iterable[slice]:
    for start in range(0, count, size):
        yield slice(start, min(count, start + size))


def check_ids(ids: np.ndarray, positions: np.ndarray) -> tuple[list[int], np.ndarray]:
    ids = np.asarray(ids)
    positions = np.asarray(positions)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ShapeError(f"ids must be a 1-D integer array, got {ids.dtype} {ids.shape}")
    if positions.shape != (ids.shape[0], 2):
        raise ShapeError(f"positions must be [{ids.shape[0]}, 2], got {positions.shape}")
    if not np.isfinite(positions).all():
        raise InputValueError("positions hold NaN or Inf values")
    id_list = ids.tolist()
    if len(set(id_list)) != len(id_list):
        raise InputValueError("ids must be unique within a tick")
    return id_list, positions.astype(np.float32)


def _empty_prediction(ids: np.ndarray) -> Prediction:
    return Prediction(ids, np.zeros((0, 0, 0, 2), np.float32), np.zeros((0, 0), np.float32))


class _Outputs:
    """The prediction of a tick's rows, filled in pieces as the calls return."""

    def __init__(self, rows: int) -> None:
        self.rows = rows
        self.traj: np.ndarray | None = None
        self.probs: np.ndarray | None = None

    def put(self, rows: np.ndarray, traj: np.ndarray, probs: np.ndarray) -> None:
        if self.traj is None or self.probs is None:
            self.traj = np.empty((self.rows, *traj.shape[1:]), np.float32)
            self.probs = np.empty((self.rows, *probs.shape[1:]), np.float32)
        self.traj[rows] = traj
        self.probs[rows] = probs

    def prediction(self, ids: np.ndarray) -> Prediction:
        if self.traj is None or self.probs is None:
            return _empty_prediction(ids)
        return Prediction(ids, self.traj, self.probs)


def _pack(flat: np.ndarray, ends: np.ndarray, kept: np.ndarray, ids: list[int]) -> np.ndarray:
    """The last ``kept[i]`` rows up to row ``ends[i]`` of ``flat``, per track, left-aligned and
    zero-padded into float32 ``[A, max(kept), 2]`` (as ``pack_histories``)."""
    first = np.cumsum(kept) - kept
    rows = flat[np.repeat(ends - kept + 1 - first, kept) + np.arange(int(kept.sum()))]
    finite = np.isfinite(rows).all(axis=1)
    if not finite.all():
        track = ids[owner(kept, int(np.argmin(finite)))]
        raise InputValueError(f"history of track {track} holds NaN or Inf values")
    return pad_histories(rows, kept, int(kept.max()))


class IncrementalEncoder:
    """Keeps ``(hidden, last_pos, last_disp)`` per track across ticks.

    A track seen at the previous tick advances by one ``step`` on its new position (one
    batched call for all of them, whatever their history length); a new track, or one that
    skipped a tick, is encoded from its history (one batched ``encode`` call); a track not
    seen at this tick is evicted. The result equals ``encode`` over ``history_of`` as long
    as each track's history grows by its new position every tick until it holds
    ``max_history`` steps; from then on the full path keeps the last ``max_history`` steps
    only, and a recurrent state cannot forget its oldest step, so such a track is encoded
    afresh every tick (``counters.slid``).

    The state lives in arrays aligned with the last tick's ids (every stored track was
    seen at that tick), so a frame gathers and scatters rows without per-track objects.
    """

    def __init__(
        self,
        predictor: ModelFn,
        hidden: int = 32,
        max_batch: int | None = None,
        max_history: int | None = None,
    ) -> None:
        bounds = default_bounds()
        self._predictor = predictor
        self.hidden = int(hidden)
        self.max_batch = int(max_batch or bounds.A)
        self.max_history = int(max_history or bounds.T)
        if self.hidden < 1 or self.max_batch < 1 or self.max_history < 1:
            raise ConfigError("hidden, max_batch and max_history must be positive")
        self._set(
            np.zeros(0, np.int64),
            np.zeros((0, self.hidden), np.float32),
            np.zeros((0, 2), np.float32),
            np.zeros((0, 2), np.float32),
            np.zeros(0, np.int64),
        )
        self.tick: int | None = None
        self.counters = EncoderCounters()

    def _set(
        self,
        ids: np.ndarray,
        hidden: np.ndarray,
        last_pos: np.ndarray,
        last_disp: np.ndarray,
        steps: np.ndarray,
    ) -> None:
        self._ids, self._hidden, self._pos, self._disp, self._steps = (
            ids,
            hidden,
            last_pos,
            last_disp,
            steps,
        )
        self._index = {int(i): k for k, i in enumerate(ids.tolist())}

    def __contains__(self, track_id: object) -> bool:
        return track_id in self._index

    def __len__(self) -> int:
        return len(self._index)

    def ids(self) -> list[int]:
        return [int(i) for i in self._ids.tolist()]

    def continuing(self, ids: Iterable[int], tick: int) -> int:
        """How many of ``ids`` were seen at ``tick - 1``."""
        if self.tick is None or self.tick != tick - 1:
            return 0
        return len(self._index.keys() & set(ids))

    def state(self, ids: Sequence[int] | None = None) -> AgentState:
        """The state of ``ids`` (every stored track, in stored order, when None)."""
        if ids is None:
            return AgentState(self._ids.copy(), self._hidden, self._pos, self._disp)
        rows = np.fromiter((self._index[int(i)] for i in ids), np.int64)
        return AgentState(
            np.asarray(list(ids), dtype=np.int64).reshape(-1),
            self._hidden[rows],
            self._pos[rows],
            self._disp[rows],
        )

    def evict(self, ids: Iterable[int]) -> int:
        gone = {int(i) for i in ids} & self._index.keys()
        if gone:
            keep = np.fromiter((int(i) not in gone for i in self._ids.tolist()), bool)
            self._set(
                self._ids[keep],
                self._hidden[keep],
                self._pos[keep],
                self._disp[keep],
                self._steps[keep],
            )
        self.counters.evicted += len(gone)
        return len(gone)

    def update(
        self,
        tick: int,
        ids: np.ndarray,
        positions: np.ndarray,
        history_of: HistorySource,
        promoted: Promoted | None = None,
    ) -> AgentState:
        """Advance to ``tick`` with this tick's observations; returns the state of ``ids``.

        ``promoted`` supplies ready states for some continuing tracks (verified
        speculation); they are installed as they are, without a call.
        """
        state, _ = self._advance(tick, ids, positions, history_of, promoted, decode=False)
        return state

    def advance(
        self,
        tick: int,
        ids: np.ndarray,
        positions: np.ndarray,
        history_of: HistorySource,
        promoted: Promoted | None = None,
    ) -> Prediction:
        """``update`` and the prediction of ``ids``: continuing tracks take one fused
        ``step_decode`` call, new ones ``encode`` and ``decode``, promoted ones none."""
        _, prediction = self._advance(tick, ids, positions, history_of, promoted, decode=True)
        assert prediction is not None
        return prediction

    def _advance(
        self,
        tick: int,
        ids: np.ndarray,
        positions: np.ndarray,
        history_of: HistorySource,
        promoted: Promoted | None,
        decode: bool,
    ) -> tuple[AgentState, Prediction | None]:
        if self.tick is not None and tick <= self.tick:
            raise InputValueError(f"ticks must increase: {tick} after {self.tick}")
        id_list, pos = check_ids(ids, positions)
        n = len(id_list)
        index = self._index
        seen = np.fromiter((index.get(i, -1) for i in id_list), np.int64, n)
        kept = int((seen >= 0).sum())
        # Rows of the previous tick that this tick continues (-1: none).
        prev = seen if self.tick is not None and tick == self.tick + 1 else np.full(n, -1)
        prev, promoted = self._slide(prev, promoted)
        given = np.zeros(n, bool)
        if promoted is not None and promoted.rows.size:
            if (prev[promoted.rows] < 0).any():
                bad = id_list[int(promoted.rows[prev[promoted.rows] < 0][0])]
                raise InputValueError(f"a promoted state needs track {bad} at tick {tick - 1}")
            given[promoted.rows] = True
        stepping = np.flatnonzero((prev >= 0) & ~given)
        fresh = np.flatnonzero(prev < 0)
        id_array = np.asarray(id_list, dtype=np.int64)
        prediction: Prediction | None
        if n and not fresh.size and not given.any() and n <= self.max_batch:
            # Steady state: one call over every track, whose outputs become the state.
            result = self._call_step(prev, pos, decode)
            hidden, last_pos, last_disp = result[:3]
            steps = self._steps[prev] + 1
            prediction = Prediction(id_array, result[3], result[4]) if decode else None
        elif n and promoted is not None and promoted.rows.tolist() == list(range(n)):
            # Every track promoted, in order: no call and nothing to scatter.
            hidden, last_pos, last_disp = promoted.hidden, promoted.last_pos, promoted.last_disp
            steps = self._steps[prev] + 1
            self.counters.installed += n
            prediction = Prediction(id_array, promoted.traj, promoted.probs) if decode else None
        else:
            hidden, last_pos, last_disp, steps, prediction = self._assemble(
                tick, id_list, pos, history_of, promoted, prev, stepping, fresh, decode
            )
        self.counters.evicted += len(index) - kept
        self._set(id_array, hidden, last_pos, last_disp, steps)
        self.tick = tick
        return AgentState(id_array, hidden, last_pos, last_disp), prediction

    def _slide(
        self, prev: np.ndarray, promoted: Promoted | None
    ) -> tuple[np.ndarray, Promoted | None]:
        """Tracks whose history already fills ``max_history`` are encoded afresh.

        The full path encodes only the last ``max_history`` steps, and a recurrent state
        cannot forget its oldest step, so one more step would drift from it.
        """
        cont = prev >= 0
        if not cont.any():
            return prev, promoted
        full = np.zeros(prev.size, bool)
        full[cont] = self._steps[prev[cont]] >= self.max_history
        if not full.any():
            return prev, promoted
        self.counters.slid += int(full.sum())
        prev = np.where(full, -1, prev)
        if promoted is not None and promoted.rows.size:
            keep = ~full[promoted.rows]
            promoted = Promoted(
                promoted.rows[keep],
                promoted.hidden[keep],
                promoted.last_pos[keep],
                promoted.last_disp[keep],
                promoted.traj[keep],
                promoted.probs[keep],
            )
        return prev, promoted

    def _assemble(
        self,
        tick: int,
        id_list: list[int],
        pos: np.ndarray,
        history_of: HistorySource,
        promoted: Promoted | None,
        prev: np.ndarray,
        stepping: np.ndarray,
        fresh: np.ndarray,
        decode: bool,
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, Prediction | None]:
        """The general case: promoted, stepped and encoded rows of one tick, scattered."""
        n = len(id_list)
        hidden = np.empty((n, self.hidden), np.float32)
        last_pos = np.empty((n, 2), np.float32)
        last_disp = np.empty((n, 2), np.float32)
        steps = np.empty(n, np.int64)
        out = _Outputs(n) if decode else None
        if promoted is not None and promoted.rows.size:
            rows = promoted.rows
            hidden[rows], last_pos[rows], last_disp[rows] = (
                promoted.hidden,
                promoted.last_pos,
                promoted.last_disp,
            )
            steps[rows] = self._steps[prev[rows]] + 1
            if out is not None:
                out.put(rows, promoted.traj, promoted.probs)
            self.counters.installed += int(rows.size)
        if stepping.size:
            self._step(prev[stepping], stepping, pos, (hidden, last_pos, last_disp), out)
            steps[stepping] = self._steps[prev[stepping]] + 1
        if fresh.size:
            f_hidden, f_pos, f_disp, lengths = self._encode(
                tick, [id_list[r] for r in fresh], pos[fresh], history_of
            )
            hidden[fresh], last_pos[fresh], last_disp[fresh] = f_hidden, f_pos, f_disp
            steps[fresh] = lengths
            if out is not None:
                state = AgentState(fresh, f_hidden, f_pos, f_disp)  # rows stand in for ids
                decoded = decode_state(self._predictor, state, self.max_batch, self.counters)
                out.put(fresh, decoded.traj, decoded.probs)
        ids = np.asarray(id_list, dtype=np.int64)
        prediction = out.prediction(ids) if out is not None else None
        return hidden, last_pos, last_disp, steps, prediction

    def _step(
        self,
        src: np.ndarray,
        dst: np.ndarray,
        pos: np.ndarray,
        into: tuple[np.ndarray, np.ndarray, np.ndarray],
        out: _Outputs | None,
    ) -> None:
        """One step of stored rows ``src`` onto ``pos[dst]``, written to rows ``dst``."""
        for part in _batches(src.size, self.max_batch):
            to = dst[part]
            result = self._call_step(src[part], pos[to], out is not None)
            for target, value in zip(into, result[:3], strict=True):
                target[to] = value
            if out is not None:
                out.put(to, result[3], result[4])

    def _call_step(self, rows: np.ndarray, new_pos: np.ndarray, decode: bool) -> list[np.ndarray]:
        """One ``step`` (or fused ``step_decode``) call over stored ``rows`` (one batch)."""
        function = "step_decode" if decode else "step"
        result = self._predictor(
            function, self._hidden[rows], self._pos[rows], self._disp[rows], new_pos
        )
        if decode:
            self.counters.step_decode_calls += 1
        else:
            self.counters.step_calls += 1
        self.counters.stepped += int(rows.size)
        return result

    def _encode(
        self, tick: int, ids: list[int], positions: np.ndarray, history_of: HistorySource
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``encode`` over the histories of ``ids``: their state rows and history lengths."""
        flat, lengths = gather_histories(history_of, ids)
        flat = flat.astype(np.float32, copy=False)
        ends = np.cumsum(lengths) - 1
        last = flat[ends]
        wrong = np.flatnonzero((last != positions).any(axis=1))
        if wrong.size:
            k = int(wrong[0])
            raise InputValueError(
                f"history of track {ids[k]} ends at {last[k]}, not at its observation "
                f"{positions[k]} of tick {tick}"
            )
        # The full path encodes the last max_history steps of a longer history.
        kept = np.minimum(lengths, self.max_history)
        parts: list[list[np.ndarray]] = [[], [], [], []]
        for part in _batches(len(ids), self.max_batch):
            batch = _pack(flat, ends[part], kept[part], ids[part])
            state = self._predictor("encode", batch, kept[part].astype(np.int32))
            for target, value in zip(parts, [*state, kept[part]], strict=True):
                target.append(value)
            self.counters.encode_calls += 1
        self.counters.encoded += len(ids)
        hidden, last_pos, last_disp, steps = (np.concatenate(p) for p in parts)
        return hidden, last_pos, last_disp, steps

    def decode(self, state: AgentState) -> Prediction:
        """Trajectories ``[A, K, H, 2]`` and probabilities ``[A, K]`` of a state."""
        return decode_state(self._predictor, state, self.max_batch, self.counters)


def decode_state(
    predictor: ModelFn,
    state: AgentState,
    max_batch: int,
    counters: EncoderCounters | None = None,
) -> Prediction:
    trajs, probs = [], []
    for part in _batches(state.ids.shape[0], max_batch):
        traj, prob = predictor(
            "decode", state.hidden[part], state.last_pos[part], state.last_disp[part]
        )
        trajs.append(traj)
        probs.append(prob)
        if counters is not None:
            counters.decode_calls += 1
    if not trajs:
        return _empty_prediction(state.ids)
    return Prediction(state.ids, np.concatenate(trajs), np.concatenate(probs))


class IncrementalPredictor:
    """Incremental encoding followed by one batched decode per tick."""

    def __init__(
        self,
        predictor: ModelFn,
        hidden: int = 32,
        max_batch: int | None = None,
        max_history: int | None = None,
    ) -> None:
        self.encoder = IncrementalEncoder(predictor, hidden, max_batch, max_history)

    def observe(
        self, tick: int, ids: np.ndarray, positions: np.ndarray, history_of: HistorySource
    ) -> Prediction:
        return self.encoder.advance(tick, ids, positions, history_of)


def full_recompute(
    predictor: ModelFn,
    ids: np.ndarray,
    histories: Sequence[np.ndarray],
    max_batch: int | None = None,
) -> Prediction:
    """The non-incremental path: ``forward`` over every agent's whole (packed) history."""
    size = int(max_batch or default_bounds().A)
    trajs, probs = [], []
    for part in _batches(len(histories), size):
        chunk = [np.asarray(h, dtype=np.float32) for h in histories[part]]
        batch, lengths = pack_histories(chunk, max(len(h) for h in chunk))
        traj, prob = predictor("forward", batch, lengths)
        trajs.append(traj)
        probs.append(prob)
    ids = np.asarray(ids, dtype=np.int64)
    if not trajs:
        return _empty_prediction(ids)
    return Prediction(ids, np.concatenate(trajs), np.concatenate(probs))


def tick_of(stamp_s: float, step_s: float) -> int:
    """The last tick (a multiple of ``step_s``) at or before ``stamp_s``."""
    return math.floor(stamp_s / step_s + 1e-9)


def track_observations(
    tracker: Tracker,
    track_ids: Iterable[int],
    tick: int,
    step_s: float,
    max_history: int | None = None,
) -> tuple[np.ndarray, np.ndarray, HistoryFn]:
    """Positions of tracks at ``tick * step_s`` on an anchored grid, and their histories.

    A track is observed at a tick only when its measurements span the tick (no
    extrapolation, as ``resample_history``); the history of a track is its resampled
    path ending at the tick, so the incremental and the full path see the same samples.
    That holds while the tracker keeps at least ``max_history`` ticks of a track
    (``TrackerParams.max_history_s`` and ``max_history_points`` at the detection rate): a
    history the tracker has already cut short stops growing, which the incremental path
    cannot see without rebuilding every history each tick.
    """
    end = tick * step_s
    steps = int(max_history or default_bounds().T)
    ids: list[int] = []
    positions: list[np.ndarray] = []
    for track_id in track_ids:
        stamps, xy = tracker.history(int(track_id))
        if stamps.size == 0 or not (stamps[0] <= end <= stamps[-1]):
            continue
        ids.append(int(track_id))
        positions.append(
            np.array(
                [np.interp(end, stamps, xy[:, 0]), np.interp(end, stamps, xy[:, 1])], np.float32
            )
        )

    def history_of(track_id: int) -> np.ndarray:
        stamps, xy = tracker.history(track_id)
        history, _ = resample_history(stamps, xy, num_steps=steps, step_s=step_s, end_stamp_s=end)
        return history

    pos = np.stack(positions) if positions else np.zeros((0, 2), np.float32)
    return np.asarray(ids, dtype=np.int64), pos, history_of


def agent_ticks(
    tracks: Mapping[int, tuple[np.ndarray, np.ndarray]],
    frame_step: int | None = None,
    max_history: int | None = None,
) -> Iterator[tuple[int, np.ndarray, np.ndarray, HistoryFn]]:
    """Annotated tracks (ETH/UCY ``tracks()``) as ticks: ``(tick, ids, positions, history_of)``.

    A tick is one annotation step; an agent's history is its run of consecutive ticks up to
    this one (at most ``max_history``), so an agent that skips a tick starts afresh.
    """
    step = frame_step or detect_frame_step(tracks)
    steps = int(max_history or default_bounds().T)
    first = min((int(frames[0]) for frames, _ in tracks.values() if len(frames)), default=0)
    runs: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
    rows: dict[int, list[tuple[int, np.ndarray]]] = {}
    for track_id, (frames, xy) in tracks.items():
        ticks = np.round((np.asarray(frames) - first) / step).astype(np.int64)
        xy32 = np.asarray(xy, dtype=np.float32)
        start = np.zeros(ticks.size, dtype=np.int64)
        for j in range(1, ticks.size):
            start[j] = start[j - 1] if ticks[j] - ticks[j - 1] == 1 else j
        runs[int(track_id)] = (ticks, xy32, start)
        for j, tick in enumerate(ticks.tolist()):
            rows.setdefault(tick, []).append((int(track_id), xy32[j]))
    for tick in sorted(rows):

        def history_of(track_id: int, tick: int = tick) -> np.ndarray:
            ticks, xy32, start = runs[track_id]
            j = int(np.searchsorted(ticks, tick))
            return xy32[max(int(start[j]), j - steps + 1) : j + 1]

        ids = np.array([r[0] for r in rows[tick]], dtype=np.int64)
        positions = np.stack([r[1] for r in rows[tick]])
        yield tick, ids, positions, history_of
