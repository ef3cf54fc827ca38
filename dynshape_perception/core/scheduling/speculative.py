"""Speculative multi-hypothesis prediction: precompute next-tick states, verify, promote, prune."""

from __future__ import annotations

import threading
import time
from collections.abc import Generator
from dataclasses import dataclass, field

import numpy as np

from dynshape_perception.core.scheduling.incremental import (
    AgentState,
    HistoryFn,
    IncrementalEncoder,
    ModelFn,
    Prediction,
    StateRow,
    decode_state,
)
from dynshape_perception.errors import ConfigError


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
    # Continuing agents whose speculation was not ready (idle time did not come).
    unspeculated: int = 0
    candidates: int = 0
    promoted_rank: dict[int, int] = field(default_factory=dict)
    critical_ms: list[float] = field(default_factory=list)
    speculate_ms: list[float] = field(default_factory=list)

    @property
    def acceptance_rate(self) -> float:
        return self.accepted / self.verified if self.verified else 0.0

    def as_dict(self) -> dict[str, object]:
        return {
            "frames": self.frames,
            "observations": self.observations,
            "verified": self.verified,
            "accepted": self.accepted,
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
        # Plain ints: the lookup runs on the critical path, once per agent.
        self._centres: list[list[tuple[int, int]]] = [
            [(int(x), int(y)) for x, y in agent] for agent in self.centres
        ]

    def lookup(self, agent: int, cell: tuple[int, int]) -> tuple[int, int] | None:
        """Row and hypothesis rank that hold ``cell`` for ``agent``, likeliest first."""
        index = self.agents.get(agent)
        if index is None:
            return None
        r = self.radius
        side = 2 * r + 1
        centres = self._centres[index]
        for rank, (cx, cy) in enumerate(centres):
            dx, dy = cell[0] - cx, cell[1] - cy
            if abs(dx) <= r and abs(dy) <= r:
                return ((index * len(centres) + rank) * side + dx + r) * side + dy + r, rank
        return None


class SpeculativePredictor:
    """Incremental prediction that reuses precomputed next-tick states when they verify.

    Verification is exact, never approximate: observations are snapped to a grid of
    ``quantum_m``, and a speculation is used only when the snapped observation equals the
    speculated input. The promoted state is then what ``step`` computes on that very input,
    and the output is that of non-speculative prediction on snapped positions. Snapping
    moves a position by at most ``quantum_m / sqrt(2)``; ETH/UCY annotations come on a 1 cm
    grid, so the default quantum loses nothing there.

    ``observe`` is the critical path: agents whose snapped observation lies in their
    speculation table are promoted without any call; the rest take one batched ``step``
    (or ``encode``) and one ``decode``. ``speculate`` (or ``speculate_chunks`` for a
    chunked executor) uses idle time to run ``step`` and ``decode`` on the grid cells
    around the likeliest hypotheses' first predicted step.
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
        self._last: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self._spec: _Speculation | None = None
        self._generation = 0
        self._lock = threading.Lock()
        self.stats = SpeculationStats()

    def observe(
        self, tick: int, ids: np.ndarray, positions: np.ndarray, history_of: HistoryFn
    ) -> Prediction:
        """This tick's prediction of ``ids``; equals non-speculative prediction on snapped input."""
        started = time.perf_counter()
        q = self.config.quantum_m
        cells, snapped = snap(positions, q)

        def snapped_history(track_id: int) -> np.ndarray:
            return snap(history_of(track_id), q)[1]

        with self._lock:
            spec = self._spec if self._spec is not None and self._spec.tick == tick else None
            given: dict[int, StateRow] = {}
            ready: dict[int, tuple[np.ndarray, np.ndarray]] = {}
            id_list = [int(i) for i in np.asarray(ids)]
            for row, track_id in enumerate(id_list):
                if not self.encoder.continues(track_id, tick):
                    continue
                if spec is None or track_id not in spec.agents:
                    self.stats.unspeculated += 1
                    continue
                self.stats.verified += 1
                hit = spec.lookup(track_id, (int(cells[row, 0]), int(cells[row, 1])))
                if hit is None:
                    continue
                k, rank = hit
                given[track_id] = (spec.hidden[k], spec.last_pos[k], spec.last_disp[k])
                ready[track_id] = (spec.traj[k], spec.probs[k])
                self.stats.accepted += 1
                self.stats.promoted_rank[rank] = self.stats.promoted_rank.get(rank, 0) + 1
            state = self.encoder.update(
                tick, np.asarray(id_list, np.int64), snapped, snapped_history, given
            )
            rest = [k for k, track_id in enumerate(id_list) if track_id not in ready]
            computed = decode_state(
                self._predictor,
                AgentState(
                    state.ids[rest], state.hidden[rest], state.last_pos[rest], state.last_disp[rest]
                ),
                self.encoder.max_batch,
                self.encoder.counters,
            )
            prediction = self._assemble(state.ids, ready, rest, computed)
            self._last = {
                int(i): (prediction.traj[k], prediction.probs[k]) for k, i in enumerate(state.ids)
            }
            # The old tables are pruned; a speculation still running is discarded on arrival.
            self._spec = None
            self._generation += 1
        self.stats.frames += 1
        self.stats.observations += len(id_list)
        self.stats.critical_ms.append((time.perf_counter() - started) * 1000.0)
        return prediction

    @staticmethod
    def _assemble(
        ids: np.ndarray,
        ready: dict[int, tuple[np.ndarray, np.ndarray]],
        rest: list[int],
        computed: Prediction,
    ) -> Prediction:
        if not ready:
            return Prediction(ids, computed.traj, computed.probs)
        sample_traj, sample_probs = next(iter(ready.values()))
        traj = np.empty((ids.shape[0], *sample_traj.shape), np.float32)
        probs = np.empty((ids.shape[0], *sample_probs.shape), np.float32)
        for k, track_id in enumerate(ids):
            hit = ready.get(int(track_id))
            if hit is not None:
                traj[k], probs[k] = hit
        if rest:
            traj[rest] = computed.traj
            probs[rest] = computed.probs
        return Prediction(ids, traj, probs)

    def speculate(self) -> int:
        """Precompute the next tick's candidates now; returns how many were computed."""
        chunks = self.speculate_chunks()
        while True:
            try:
                next(chunks)
            except StopIteration as stop:
                return int(stop.value)

    def speculate_chunks(self) -> Generator[None, None, int]:
        """``speculate`` split into one ``step`` + ``decode`` call per chunk (for an executor)."""
        started = time.perf_counter()
        with self._lock:
            tick = self.encoder.tick
            generation = self._generation
            agents = [i for i in self.encoder.ids() if i in self._last]
            state = self.encoder.state(agents)
            last = [self._last[i] for i in agents]
        if tick is None or not agents:
            return 0
        centres, cells, compute = self._candidates(last)
        rows = np.repeat(np.arange(len(agents)), cells.shape[0] // len(agents))[compute]
        new_pos = cells_to_positions(cells[compute], self.config.quantum_m)
        total = cells.shape[0]
        out_hidden = np.zeros((total, state.hidden.shape[1]), np.float32)
        out_pos = np.zeros((total, 2), np.float32)
        out_disp = np.zeros((total, 2), np.float32)
        traj_shape = last[0][0].shape
        out_traj = np.zeros((total, *traj_shape), np.float32)
        out_probs = np.zeros((total, last[0][1].shape[0]), np.float32)
        size = self.encoder.max_batch
        for start in range(0, rows.size, size):
            part = rows[start : start + size]
            target = compute[start : start + size]
            hidden, last_pos, last_disp = self._predictor(
                "step",
                state.hidden[part],
                state.last_pos[part],
                state.last_disp[part],
                np.ascontiguousarray(new_pos[start : start + size]),
            )
            traj, probs = self._predictor("decode", hidden, last_pos, last_disp)
            out_hidden[target], out_pos[target], out_disp[target] = hidden, last_pos, last_disp
            out_traj[target], out_probs[target] = traj, probs
            yield None
        speculation = _Speculation(
            tick=tick + 1,
            agents={agent: k for k, agent in enumerate(agents)},
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
        self.stats.candidates += int(rows.size)
        self.stats.speculate_ms.append((time.perf_counter() - started) * 1000.0)
        return int(rows.size)

    def _candidates(
        self, last: list[tuple[np.ndarray, np.ndarray]]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Hypothesis cells ``[A, m, 2]``, every square's cells ``[A * m * side**2, 2]`` in row
        order, and the indices of the cells to compute (not held by a likelier square)."""
        r = self.config.radius_cells
        m = min(self.config.top_hypotheses, last[0][1].shape[0])
        first = np.stack([traj[np.argsort(-probs, kind="stable")[:m], 0] for traj, probs in last])
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
