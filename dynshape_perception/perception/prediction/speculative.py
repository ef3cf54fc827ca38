"""Speculative multi-hypothesis prediction: precompute next-tick states, verify, promote, prune."""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Generator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar, cast

import numpy as np

from dynshape_perception.errors import ConfigError, InputValueError
from dynshape_perception.perception.prediction.incremental import (
    Histories,
    HistorySource,
    IncrementalEncoder,
    ModelFn,
    Prediction,
    Promoted,
    check_ids,
    gather_histories,
    owner,
)

# Critical-path and speculation timings kept: a node speculates for days.
TIMING_WINDOW = 100_000
_T = TypeVar("_T")


def run_to_end(chunks: Generator[None, None, _T]) -> _T:
    """A chunked computation run on the calling thread, all chunks at once: its result."""
    while True:
        try:
            next(chunks)
        except StopIteration as stop:
            return cast(_T, stop.value)


@dataclass(frozen=True)
class SpeculationConfig:
    quantum_m: float = 0.01
    # Speculated cells span +-radius_cells around each hypothesis' first predicted step.
    radius_cells: int = 3
    top_hypotheses: int = 2

    def __post_init__(self) -> None:
        if not (np.isfinite(self.quantum_m) and self.quantum_m > 0.0):
            raise ConfigError(f"quantum_m must be > 0, got {self.quantum_m!r}")
        if not isinstance(self.radius_cells, int) or self.radius_cells < 0:
            raise ConfigError(f"radius_cells must be an integer >= 0, got {self.radius_cells!r}")
        if not isinstance(self.top_hypotheses, int) or self.top_hypotheses < 1:
            raise ConfigError(
                f"top_hypotheses must be an integer >= 1, got {self.top_hypotheses!r}"
            )

    @property
    def cells_per_hypothesis(self) -> int:
        return (2 * self.radius_cells + 1) ** 2


def snap(positions: np.ndarray, quantum_m: float) -> tuple[np.ndarray, np.ndarray]:
    """Grid cells (int64 ``[..., 2]``) and the float32 positions they stand for."""
    cells = np.round(np.asarray(positions, dtype=np.float64) / quantum_m).astype(np.int64)
    return cells, cells_to_positions(cells, quantum_m)


def cells_to_positions(cells: np.ndarray, quantum_m: float) -> np.ndarray:
    return (cells.astype(np.float64) * quantum_m).astype(np.float32)


@dataclass
class SpeculationStats:
    frames: int = 0
    observations: int = 0
    # Continuing agents for which a speculation for this tick was ready.
    verified: int = 0
    accepted: int = 0
    # Accepted agents installed without a call, and the frames where that removed the
    # step_decode call (every continuing agent accepted).
    promoted: int = 0
    promoted_frames: int = 0
    # Continuing agents whose speculation was not ready (idle time did not come).
    unspeculated: int = 0
    candidates: int = 0
    promoted_rank: dict[int, int] = field(default_factory=dict)
    critical_ms: deque[float] = field(default_factory=lambda: deque(maxlen=TIMING_WINDOW))
    speculate_ms: deque[float] = field(default_factory=lambda: deque(maxlen=TIMING_WINDOW))

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.verified if self.verified else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "frames": self.frames,
            "observations": self.observations,
            "verified": self.verified,
            "accepted": self.accepted,
            "promoted": self.promoted,
            "promoted_frames": self.promoted_frames,
            "unspeculated": self.unspeculated,
            "acceptance_rate": round(self.acceptance_rate, 4),
            "candidates": self.candidates,
            "promoted_rank": dict(sorted(self.promoted_rank.items())),
        }


@dataclass
class _Speculation:
    """Precomputed next-tick outputs on square grids of cells around hypotheses.

    Row ``(a * m + j) * side**2 + (dx + r) * side + (dy + r)`` holds agent ``a``'s outputs
    for the cell at offset ``(dx, dy)`` from its rank-``j`` hypothesis; a cell that a
    likelier hypothesis' square already holds is not computed, and never looked up.
    """

    tick: int
    agents: dict[int, int]
    centres: np.ndarray
    radius: int
    hidden: np.ndarray
    last_pos: np.ndarray
    last_disp: np.ndarray
    traj: np.ndarray
    probs: np.ndarray

    def __post_init__(self) -> None:
        # Plain ints: verification runs on the critical path, over a handful of agents,
        # where Python arithmetic beats a dozen small array operations.
        self._centres: list[list[tuple[int, int]]] = [
            [(int(x), int(y)) for x, y in agent] for agent in self.centres.tolist()
        ]

    def promote(self, ids: list[int], cells: list[list[int]]) -> list[int] | None:
        """Table rows for every agent of ``ids`` that has a table, in order; None as soon as
        one of them misses (the frame then steps every agent, so nothing is promoted)."""
        r = self.radius
        side = 2 * r + 1
        table: list[int] = []
        for row, track_id in enumerate(ids):
            agent = self.agents.get(track_id)
            if agent is None:
                continue
            x, y = cells[row]
            centres = self._centres[agent]
            for rank, (cx, cy) in enumerate(centres):
                dx, dy = x - cx, y - cy
                if -r <= dx <= r and -r <= dy <= r:
                    table.append(((agent * len(centres) + rank) * side + dx + r) * side + dy + r)
                    break
            else:
                return None
        return table

    def match(
        self, ids: list[int], cells: list[list[int]]
    ) -> tuple[list[int], list[int], list[int], int]:
        """Verify a tick's snapped observations against the tables.

        Returns the rows of ``ids`` whose cell a table holds, the table rows that hold them,
        the hypothesis ranks (the likeliest square that holds the cell: a likelier one was
        never computed there), and how many of ``ids`` had a table at all.
        """
        r = self.radius
        side = 2 * r + 1
        rows: list[int] = []
        table: list[int] = []
        ranks: list[int] = []
        verified = 0
        for row, track_id in enumerate(ids):
            agent = self.agents.get(track_id)
            if agent is None:
                continue
            verified += 1
            x, y = cells[row]
            centres = self._centres[agent]
            for rank, (cx, cy) in enumerate(centres):
                dx, dy = x - cx, y - cy
                if -r <= dx <= r and -r <= dy <= r:
                    rows.append(row)
                    table.append(((agent * len(centres) + rank) * side + dx + r) * side + dy + r)
                    ranks.append(rank)
                    break
        return rows, table, ranks, verified


class SpeculativePredictor:
    """Incremental prediction that reuses precomputed next-tick states when they verify.

    Verification is exact, never approximate: observations are snapped to a grid of
    ``quantum_m``, and a speculation is used only when the snapped observation equals the
    speculated input. The promoted state is then what ``step`` computes on that very input,
    and the output is that of non-speculative prediction on snapped positions. Snapping
    moves a position by at most ``quantum_m / sqrt(2)``; ETH/UCY annotations come on a 1 cm
    grid, so the default quantum loses nothing there.

    ``observe`` is the critical path: when every continuing agent's snapped observation
    lies in its speculation table, they are promoted without the ``step_decode`` call (new
    agents still take ``encode`` and ``decode``); otherwise continuing agents take one
    batched ``step_decode`` as in the plain path, accepted ones included, since a call
    costs mostly its fixed overhead and promoting part of a frame would save nothing.
    ``speculate`` (or ``speculate_chunks`` for a chunked executor) uses idle time
    to run ``step_decode`` on the grid cells around the likeliest hypotheses' first
    predicted step.
    """

    def __init__(
        self,
        predictor: ModelFn,
        config: SpeculationConfig | None = None,
        hidden: int = 32,
        max_batch: int | None = None,
        max_history: int | None = None,
    ) -> None:
        self.config = config or SpeculationConfig()
        self._predictor = predictor
        self.encoder = IncrementalEncoder(predictor, hidden, max_batch, max_history)
        self._last: Prediction | None = None
        self._spec: _Speculation | None = None
        self._generation = 0
        self._lock = threading.Lock()
        self._stats = SpeculationStats()
        self._unsettled: tuple[_Speculation, list[int], list[list[int]]] | None = None

    def observe(
        self, tick: int, ids: np.ndarray, positions: np.ndarray, history_of: HistorySource
    ) -> Prediction:
        """This tick's prediction of ``ids``; equals non-speculative prediction on snapped input."""
        started = time.perf_counter()
        q = self.config.quantum_m
        # Checked before snapping: a NaN would snap to a finite (and absurd) cell.
        id_list = check_ids(ids, positions)[0]
        cells, snapped = snap(positions, q)

        def snapped_of(track_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
            flat, lengths = gather_histories(history_of, track_ids)
            finite = np.isfinite(flat).all(axis=1)
            if not finite.all():
                track_id = track_ids[owner(lengths, int(np.argmin(finite)))]
                raise InputValueError(f"history of track {track_id} holds NaN or Inf values")
            return snap(flat, q)[1], lengths

        snapped_history = Histories(snapped_of)

        with self._lock:
            encoder = self.encoder
            spec = self._spec if self._spec is not None and self._spec.tick == tick else None
            promoted = None
            continuing = encoder.continuing(id_list, tick)
            stats = self._stats
            if spec is None:
                stats.unspeculated += continuing
            elif continuing:
                cell_list = cells.tolist()
                # The acceptance count is taken off the critical path (``_settle_locked``).
                self._unsettled = (spec, id_list, cell_list)
                # A call costs mostly its fixed overhead: promoting some agents of a frame
                # that calls step_decode for others saves nothing and costs a scatter, so
                # the frame is promoted only when every continuing agent verifies.
                table = spec.promote(id_list, cell_list)
                if table is not None:
                    rows = [k for k, i in enumerate(id_list) if i in spec.agents]
                    promoted = Promoted(
                        np.asarray(rows, np.int64),
                        spec.hidden[table],
                        spec.last_pos[table],
                        spec.last_disp[table],
                        spec.traj[table],
                        spec.probs[table],
                    )
            prediction = encoder.advance(
                tick, np.asarray(id_list, np.int64), snapped, snapped_history, promoted
            )
            # Counted once the tick is accepted: a rejected tick promoted nothing.
            if promoted is not None:
                stats.promoted += int(promoted.rows.size)
                stats.promoted_frames += 1
            self._last = prediction
            # The old tables are pruned; a speculation still running is discarded on arrival.
            self._spec = None
            self._generation += 1
            stats.frames += 1
            stats.observations += len(id_list)
            stats.critical_ms.append((time.perf_counter() - started) * 1000.0)
        return prediction

    def evict(self, ids: Iterable[int]) -> int:
        """Forget tracks between ticks (they died); a pending speculation is dropped, since
        it may hold a state for an id that comes back as a new track."""
        gone = {int(i) for i in ids}
        with self._lock:
            evicted = self.encoder.evict(gone)
            if evicted:
                last = self._last
                if last is not None:
                    keep = np.fromiter((int(i) not in gone for i in last.ids.tolist()), bool)
                    self._last = Prediction(last.ids[keep], last.traj[keep], last.probs[keep])
                self._spec = None
                self._generation += 1
        return evicted

    @property
    def stats(self) -> SpeculationStats:
        with self._lock:
            self._settle_locked()
            return self._stats

    def _settle_locked(self) -> None:
        """Count the last verified frame's accepted agents and hypothesis ranks (idle time)."""
        if self._unsettled is None:
            return
        spec, id_list, cells = self._unsettled
        self._unsettled = None
        rows, _, ranks, verified = spec.match(id_list, cells)
        stats = self._stats
        stats.verified += verified
        stats.accepted += len(rows)
        for rank in ranks:
            stats.promoted_rank[rank] = stats.promoted_rank.get(rank, 0) + 1

    def speculate(self) -> int:
        """Precompute the next tick's candidates now; returns how many were computed."""
        return run_to_end(self.speculate_chunks())

    def speculate_chunks(self) -> Generator[None, None, int]:
        """``speculate`` split into one ``step_decode`` call per chunk (for an executor)."""
        started = time.perf_counter()
        with self._lock:
            self._settle_locked()
            tick = self.encoder.tick
            generation = self._generation
            state = self.encoder.state()
            last = self._last
        if tick is None or last is None or not state.ids.size or last.probs.shape[0] == 0:
            return 0
        centres, cells, compute = self._candidates(last)
        per_agent = cells.shape[0] // state.ids.size
        rows = compute // per_agent
        new_pos = cells_to_positions(cells[compute], self.config.quantum_m)
        total = cells.shape[0]
        out_hidden = np.zeros((total, state.hidden.shape[1]), np.float32)
        out_pos = np.zeros((total, 2), np.float32)
        out_disp = np.zeros((total, 2), np.float32)
        out_traj = np.zeros((total, *last.traj.shape[1:]), np.float32)
        out_probs = np.zeros((total, last.probs.shape[1]), np.float32)
        size = self.encoder.max_batch
        for start in range(0, rows.size, size):
            part = rows[start : start + size]
            target = compute[start : start + size]
            hidden, last_pos, last_disp, traj, probs = self._predictor(
                "step_decode",
                state.hidden[part],
                state.last_pos[part],
                state.last_disp[part],
                new_pos[start : start + size],
            )
            out_hidden[target], out_pos[target], out_disp[target] = hidden, last_pos, last_disp
            out_traj[target], out_probs[target] = traj, probs
            yield None
        speculation = _Speculation(
            tick=tick + 1,
            agents={agent: k for k, agent in enumerate(state.ids.tolist())},
            centres=centres,
            radius=self.config.radius_cells,
            hidden=out_hidden,
            last_pos=out_pos,
            last_disp=out_disp,
            traj=out_traj,
            probs=out_probs,
        )
        with self._lock:
            if self._generation != generation:
                return 0
            self._spec = speculation
            self._stats.candidates += int(rows.size)
            self._stats.speculate_ms.append((time.perf_counter() - started) * 1000.0)
        return int(rows.size)

    def _candidates(self, last: Prediction) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Hypothesis cells ``[A, m, 2]``, every square's cells ``[A * m * side**2, 2]`` in row
        order, and the indices of the cells to compute (not held by a likelier square)."""
        r = self.config.radius_cells
        m = min(self.config.top_hypotheses, last.probs.shape[1])
        order = np.argsort(-last.probs, axis=1, kind="stable")[:, :m]
        first = last.traj[np.arange(order.shape[0])[:, None], order, 0]
        centres, _ = snap(first, self.config.quantum_m)
        span = np.arange(-r, r + 1)
        offsets = np.stack(np.meshgrid(span, span, indexing="ij"), axis=-1).reshape(-1, 2)
        cells = centres[:, :, None, :] + offsets[None, None, :, :]
        held = np.zeros(cells.shape[:3], dtype=bool)
        for rank in range(1, m):
            for likelier in range(rank):
                gap = np.abs(cells[:, rank] - centres[:, likelier, None, :]).max(axis=-1)
                held[:, rank] |= gap <= r
        return centres, cells.reshape(-1, 2), np.flatnonzero(~held.reshape(-1))
