"""Incremental history encoding: per-track predictor state, one batched GRU step per tick."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dynshape_perception.config import default_bounds
from dynshape_perception.core.eval.prediction import detect_frame_step
from dynshape_perception.core.perception.history import pack_histories, resample_history
from dynshape_perception.core.perception.tracking import Tracker
from dynshape_perception.errors import ConfigError, InputValueError, ShapeError

ModelFn = Callable[..., list[np.ndarray]]
# Track id -> its positions [L, 2] on the tick grid, oldest first, ending at this tick.
HistoryFn = Callable[[int], np.ndarray]
StateRow = tuple[np.ndarray, np.ndarray, np.ndarray]


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
    encode_calls: int = 0
    decode_calls: int = 0
    stepped: int = 0
    encoded: int = 0
    installed: int = 0
    evicted: int = 0


@dataclass
class _Track:
    hidden: np.ndarray
    last_pos: np.ndarray
    last_disp: np.ndarray
    tick: int
    steps: int = field(default=1)


def _batches(count: int, size: int) -> Iterable[slice]:
    for start in range(0, count, size):
        yield slice(start, min(count, start + size))


def _check_ids(ids: np.ndarray, positions: np.ndarray) -> tuple[list[int], np.ndarray]:
    ids = np.asarray(ids)
    positions = np.asarray(positions)
    if ids.ndim != 1 or not np.issubdtype(ids.dtype, np.integer):
        raise ShapeError(f"ids must be a 1-D integer array, got {ids.dtype} {ids.shape}")
    if positions.shape != (ids.shape[0], 2):
        raise ShapeError(f"positions must be [{ids.shape[0]}, 2], got {positions.shape}")
    if not np.isfinite(positions).all():
        raise InputValueError("positions hold NaN or Inf values")
    id_list = [int(i) for i in ids]
    if len(set(id_list)) != len(id_list):
        raise InputValueError("ids must be unique within a tick")
    return id_list, positions.astype(np.float32)


class IncrementalEncoder:
    """Keeps ``(hidden, last_pos, last_disp)`` per track across ticks.

    A track seen at the previous tick advances by one ``step`` on its new position (one
    batched call for all of them, whatever their history length); a new track, or one that
    skipped a tick, is encoded from its history (one batched ``encode`` call); a track not
    seen at this tick is evicted. The result equals ``encode`` over the full history while
    that history fits the bound T; beyond T the full path keeps the last T steps only.
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
        self._tracks: dict[int, _Track] = {}
        self.tick: int | None = None
        self.counters = EncoderCounters()

    def __contains__(self, track_id: object) -> bool:
        return track_id in self._tracks

    def __len__(self) -> int:
        return len(self._tracks)

    def ids(self) -> list[int]:
        return list(self._tracks)

    def continues(self, track_id: int, tick: int) -> bool:
        """Whether ``track_id`` was seen at ``tick - 1`` and can advance by one step."""
        track = self._tracks.get(int(track_id))
        return track is not None and track.tick == tick - 1

    def state(self, ids: Sequence[int]) -> AgentState:
        rows = [self._tracks[int(i)] for i in ids]
        if not rows:
            empty = np.zeros((0, 2), np.float32)
            return AgentState(
                np.zeros(0, np.int64), np.zeros((0, self.hidden), np.float32), empty, empty
            )
        return AgentState(
            ids=np.asarray(list(ids), dtype=np.int64),
            hidden=np.stack([r.hidden for r in rows]),
            last_pos=np.stack([r.last_pos for r in rows]),
            last_disp=np.stack([r.last_disp for r in rows]),
        )

    def evict(self, ids: Iterable[int]) -> int:
        gone = 0
        for track_id in ids:
            if self._tracks.pop(int(track_id), None) is not None:
                gone += 1
        self.counters.evicted += gone
        return gone

    def update(
        self,
        tick: int,
        ids: np.ndarray,
        positions: np.ndarray,
        history_of: HistoryFn,
        given: Mapping[int, StateRow] | None = None,
    ) -> AgentState:
        """Advance to ``tick`` with this tick's observations; returns the state of ``ids``.

        ``given`` supplies ready states for some continuing tracks (verified speculation);
        they are installed as they are, without a call.
        """
        if self.tick is not None and tick <= self.tick:
            raise InputValueError(f"ticks must increase: {tick} after {self.tick}")
        id_list, pos = _check_ids(ids, positions)
        given = given or {}
        self.evict([i for i in self._tracks if i not in set(id_list)])
        stepping: list[int] = []
        fresh: list[int] = []
        for row, track_id in enumerate(id_list):
            if track_id in given:
                if not self.continues(track_id, tick):
                    raise InputValueError(
                        f"a given state needs track {track_id} at tick {tick - 1}"
                    )
                hidden, last_pos, last_disp = given[track_id]
                steps = self._tracks[track_id].steps + 1
                self._tracks[track_id] = _Track(hidden, last_pos, last_disp, tick, steps)
                self.counters.installed += 1
            elif self.continues(track_id, tick):
                stepping.append(row)
            else:
                fresh.append(row)
        self._step(tick, [id_list[r] for r in stepping], pos[stepping])
        self._encode(tick, [id_list[r] for r in fresh], pos[fresh], history_of)
        self.tick = tick
        return self.state(id_list)

    def _step(self, tick: int, ids: list[int], new_pos: np.ndarray) -> None:
        if not ids:
            return
        before = self.state(ids)
        for part in _batches(len(ids), self.max_batch):
            hidden, last_pos, last_disp = self._predictor(
                "step",
                before.hidden[part],
                before.last_pos[part],
                before.last_disp[part],
                np.ascontiguousarray(new_pos[part]),
            )
            self.counters.step_calls += 1
            for k, track_id in enumerate(ids[part]):
                steps = self._tracks[track_id].steps + 1
                self._tracks[track_id] = _Track(hidden[k], last_pos[k], last_disp[k], tick, steps)
        self.counters.stepped += len(ids)

    def _encode(
        self, tick: int, ids: list[int], positions: np.ndarray, history_of: HistoryFn
    ) -> None:
        if not ids:
            return
        histories = []
        for track_id, position in zip(ids, positions, strict=True):
            history = np.asarray(history_of(track_id), dtype=np.float32)
            if history.ndim != 2 or history.shape[1] != 2 or history.shape[0] < 1:
                raise ShapeError(
                    f"history of track {track_id} must be [L>=1, 2], got {history.shape}"
                )
            if not np.array_equal(history[-1], position):
                raise InputValueError(
                    f"history of track {track_id} ends at {history[-1]}, not at its observation "
                    f"{position} of tick {tick}"
                )
            histories.append(history[-self.max_history :])
        for part in _batches(len(ids), self.max_batch):
            chunk = histories[part]
            batch, lengths = pack_histories(chunk, max(len(h) for h in chunk))
            hidden, last_pos, last_disp = self._predictor("encode", batch, lengths)
            self.counters.encode_calls += 1
            for k, track_id in enumerate(ids[part]):
                self._tracks[track_id] = _Track(
                    hidden[k], last_pos[k], last_disp[k], tick, int(lengths[k])
                )
        self.counters.encoded += len(ids)

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
        return Prediction(
            state.ids, np.zeros((0, 0, 0, 2), np.float32), np.zeros((0, 0), np.float32)
        )
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
        self, tick: int, ids: np.ndarray, positions: np.ndarray, history_of: HistoryFn
    ) -> Prediction:
        state = self.encoder.update(tick, ids, positions, history_of)
        return self.encoder.decode(state)


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
        return Prediction(ids, np.zeros((0, 0, 0, 2), np.float32), np.zeros((0, 0), np.float32))
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
