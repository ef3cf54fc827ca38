"""How the prediction stage predicts: its settings, each a declared parameter or derived."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dynshape_perception.config import default_bounds, integer
from dynshape_perception.errors import ConfigError
from dynshape_perception.paramspec import check_fields, derived, param
from dynshape_perception.perception.prediction.speculative import SpeculationConfig

MODES = ("incremental", "full")
MAX_PHASES = 64
MIN_QUANTUM_M = 1e-4
MAX_QUANTUM_M = 1.0
MAX_RADIUS_CELLS = 100
MAX_HYPOTHESES = 64


@dataclass(frozen=True)
class PredictionSettings:
    """How the stage predicts; ``phases`` grid points per predictor step (rate x step)."""

    min_history_steps: int = param(
        2,
        "history samples (at the predictor's step) an agent needs to be predicted; at "
        "most the predictor's history steps (predictor.history_steps of "
        "config/models.yaml, capped by bounds.max_history_steps), checked on set",
        low=1,
        # Not the predictor's steps: the on-set check then gives the reason, where
        # rclpy's range check would only say "out of range".
        high=default_bounds().T,
    )
    history_stride: int = param(
        0,
        "steps a history's start jumps forward by when it would pass history_steps, in "
        "every mode: a window sliding one step per frame would cost a forward call over "
        "it each frame (a recurrent state cannot forget a step), so histories past it "
        "cycle from history_steps - stride + 1 up to history_steps steps, and a track is "
        "encoded once per stride; 0: half of history_steps; at most history_steps - "
        "min_history_steps + 1",
        read_only=True,
        low=0,
        high=default_bounds().T,
    )
    mode: str = param(
        "incremental",
        "incremental: each track keeps its GRU state and a frame costs one step_decode "
        "call whatever its history length, plus one encode of the tracks whose history "
        "restarts (history_stride); full: forward over every history each frame (the "
        "same histories, the same outputs within the parity tolerance); a change "
        "restarts the tracks",
        choices=MODES,
    )
    speculation: bool = param(
        False,
        "in idle time (tier 4), precompute the next frame's likeliest observations; used "
        "only when an observation verifies exactly, so no output changes",
    )
    phases: int = param(
        4,
        "grid points per predictor step: the track rate times the predictor step "
        "(10 Hz x 0.4 s = 4); each frame advances the state of its grid point",
        read_only=True,
        low=1,
        high=MAX_PHASES,
        key="grid_phases",
    )
    quantum_m: float = param(
        0.01,
        "track positions are snapped to this grid in every mode (speculation verifies on it)",
        read_only=True,
        low=MIN_QUANTUM_M,
        high=MAX_QUANTUM_M,
        key="position_quantum_m",
    )
    speculation_radius_cells: int = param(
        3,
        "speculated cells (of position_quantum_m) around each hypothesis' first step, either side",
        read_only=True,
        low=0,
        high=MAX_RADIUS_CELLS,
    )
    speculation_hypotheses: int = param(
        2,
        "likeliest hypotheses whose first step is speculated",
        read_only=True,
        low=1,
        high=MAX_HYPOTHESES,
    )
    step_s: float = derived("predictor.step_s of config/models.yaml", 0.4)
    history_steps: int = derived(
        "prediction.history_steps, else predictor.history_steps of config/models.yaml", 8
    )
    max_agents: int = derived("bounds.max_agents", 64)

    def __post_init__(self) -> None:
        check_fields(self)
        for name in ("history_steps", "max_agents"):
            if integer(name, getattr(self, name)) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.min_history_steps > self.history_steps:
            raise ConfigError(
                f"min_history_steps {self.min_history_steps} exceeds history_steps "
                f"{self.history_steps}: no agent could ever be predicted"
            )
        if self.history_stride > self.history_steps - self.min_history_steps + 1:
            raise ConfigError(
                f"history_stride {self.history_stride} restarts a history of history_steps "
                f"{self.history_steps} below min_history_steps {self.min_history_steps}: at "
                f"most {self.history_steps - self.min_history_steps + 1}"
            )
        if not (isinstance(self.step_s, (int, float)) and math.isfinite(self.step_s)):
            raise ConfigError(f"step_s must be a finite number, got {self.step_s!r}")
        if self.step_s <= 0.0:
            raise ConfigError(f"step_s must be > 0, got {self.step_s}")
        # Checked by the speculation config itself, on every mode: a typo fails at start.
        self.speculation_config()

    @property
    def grid_s(self) -> float:
        return self.step_s / self.phases

    @property
    def stride(self) -> int:
        """``history_stride``, or half the window (kept above ``min_history_steps``)."""
        if self.history_stride:
            return self.history_stride
        return max(1, min(self.history_steps // 2, self.history_steps - self.min_history_steps + 1))

    def history_length(self, steps: int) -> int:
        """The anchored history length of a track observed at ``steps`` predictor steps.

        Up to the window it is every step; past it the history's start jumps ``stride``
        steps forward each time the history would pass the window, so that it cycles from
        ``history_steps - stride + 1`` up to ``history_steps`` and grows by one step per
        predictor step in between.
        """
        window = self.history_steps
        if steps <= window:
            return steps
        stride = self.stride
        return window - stride + 1 + (steps - window - 1) % stride

    def speculation_config(self) -> SpeculationConfig:
        return SpeculationConfig(
            self.quantum_m, self.speculation_radius_cells, self.speculation_hypotheses
        )
