"""JIT policy: configuration, hotness, the measured cost model, strikes and auto-degrade."""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from dynshape_perception.core.runtime.shapes import DimPolicy, Signature
from dynshape_perception.errors import ConfigError

log = logging.getLogger(__name__)

MODES = ("off", "frozen", "adaptive")
DEGRADE_MIN_FINISHED = 3
COMPILE_MODES = ("process", "thread")

# Bucket edges of the weak dims: point counts never repeat, so P is bucketed; the others
# repeat often and are cheap to specialise exactly.
DEFAULT_WEAK_EDGES: dict[str, dict[str, tuple[int, ...]]] = {
    "segmenter": {
        "P": (
            2048,
            4096,
            8192,
            12288,
            16384,
            20480,
            24576,
            32768,
            40960,
            49152,
            65536,
            81920,
            98304,
            114688,
            131072,
            150000,
        ),
    },
    "associator": {},
    "predictor": {"T": (8, 12, 16, 20, 32, 48, 64, 96, 128)},
}


@dataclass(frozen=True)
class JitConfig:
    mode: str = "adaptive"
    hotness_threshold: int = 8
    inference_profile: bool = False
    weak_edges: Mapping[str, Mapping[str, tuple[int, ...]]] = field(
        default_factory=lambda: DEFAULT_WEAK_EDGES
    )
    max_entries: int = 1024
    max_bytes: int = 512 * 1024 * 1024
    pool_size: int = 1
    compile_mode: str = "process"
    compile_timeout_s: float = 120.0
    max_strikes: int = 3
    degrade_min_misses: int = 20
    degrade_completion_rate: float = 0.3
    degrade_cooldown_s: float = 30.0
    # Specialise only when the cost model's expected benefit exceeds this.
    min_benefit_ms: float = 0.0
    # A specialisation serves only if it runs in under this fraction of the generic time.
    accept_ratio: float = 1.0
    prior_speedup: float = 0.8
    prior_compile_s: float = 1.5
    # How far ahead a key's observed call rate is trusted when amortising a compile.
    horizon_s: float = 600.0
    validate_rtol: float = 1e-4
    validate_atol: float = 1e-5

    def __post_init__(self) -> None:
        if self.mode not in MODES:
            raise ConfigError(f"jit mode must be one of {MODES}, got {self.mode!r}")
        if self.compile_mode not in COMPILE_MODES:
            raise ConfigError(f"compile_mode must be one of {COMPILE_MODES}")
        for name in ("hotness_threshold", "max_entries", "max_bytes", "pool_size", "max_strikes"):
            if int(getattr(self, name)) < 1:
                raise ConfigError(f"jit {name} must be >= 1, got {getattr(self, name)!r}")
        if not 0.0 <= self.degrade_completion_rate <= 1.0:
            raise ConfigError("degrade_completion_rate must lie in [0, 1]")
        if self.horizon_s <= 0:
            raise ConfigError(f"jit horizon_s must be > 0, got {self.horizon_s!r}")
        if self.compile_timeout_s <= 0 or self.degrade_cooldown_s < 0:
            raise ConfigError("compile_timeout_s must be > 0 and degrade_cooldown_s >= 0")

    @property
    def threshold(self) -> int:
        """Calls before a shape is hot: 3 in an inference profile, where shapes are known."""
        return min(3, self.hotness_threshold) if self.inference_profile else self.hotness_threshold

    def dim_policy(self, model: str) -> DimPolicy:
        return DimPolicy({k: tuple(v) for k, v in self.weak_edges.get(model, {}).items()})

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> JitConfig:
        known = set(cls.__dataclass_fields__)
        unknown = set(raw) - known
        if unknown:
            raise ConfigError(f"unknown jit settings: {sorted(unknown)}")
        values = dict(raw)
        if "weak_edges" in values:
            values["weak_edges"] = {
                m: {d: tuple(int(x) for x in e) for d, e in dims.items()}
                for m, dims in values["weak_edges"].items()
            }
        return cls(**values)


@dataclass
class KeyState:
    """What the policy knows about one specialisation key."""

    calls: int = 0
    first_seen_s: float = 0.0
    last_seen_s: float = 0.0
    generic_ms: float = 0.0
    strikes: int = 0
    blacklisted: bool = False
    rejected: bool = False
    accepted: bool = False
    sample: list[Any] | None = None


class CostModel:
    """benefit = expected calls x (generic - specialised ms) - compile cost, all measured.

    Expected future calls are the key's observed call rate times ``horizon_s`` (a shape that
    was hot stays hot for the horizon), and never fewer than the calls seen so far; the
    specialised latency is the generic one times the measured speedup of earlier
    specialisations; the compile cost is the measured mean compile time.
    """

    def __init__(self, prior_speedup: float, prior_compile_s: float, horizon_s: float) -> None:
        self.horizon_s = horizon_s
        self.speedup = prior_speedup
        self.compile_s = prior_compile_s
        self._speedups = 0
        self._compiles = 0

    def observe_speedup(self, ratio: float) -> None:
        self._speedups += 1
        self.speedup += (ratio - self.speedup) / min(self._speedups, 10)

    def observe_compile(self, seconds: float) -> None:
        self._compiles += 1
        self.compile_s += (seconds - self.compile_s) / min(self._compiles, 10)

    def expected_calls(self, state: KeyState) -> float:
        span = state.last_seen_s - state.first_seen_s
        if state.calls < 2 or span <= 0.0:
            return float(state.calls)
        return max(float(state.calls), (state.calls - 1) / span * self.horizon_s)

    def benefit_ms(self, state: KeyState) -> float:
        saved = state.generic_ms * (1.0 - self.speedup)
        return self.expected_calls(state) * saved - self.compile_s * 1000.0


class DegradeGuard:
    """Stops specialising while compiles cannot keep up, and resumes after a cool-down."""

    def __init__(self, config: JitConfig) -> None:
        self.config = config
        self.consecutive_misses = 0
        self.requested = 0
        self.completed = 0
        self.failed = 0
        self.until = 0.0
        self.episodes = 0

    @property
    def active(self) -> bool:
        return time.monotonic() < self.until

    def on_hit(self) -> None:
        self.consecutive_misses = 0

    def on_miss(self) -> bool:
        """Count a miss of an accepted key; True when this miss starts a degrade episode."""
        self.consecutive_misses += 1
        if self.active or self.consecutive_misses < self.config.degrade_min_misses:
            return False
        # Judge finished compiles only: a queue still being worked off is not a failure, but
        # compiles that keep failing or timing out make every miss futile.
        finished = self.completed + self.failed
        if finished < DEGRADE_MIN_FINISHED:
            return False
        rate = self.completed / finished
        if rate >= self.config.degrade_completion_rate:
            return False
        self.until = time.monotonic() + self.config.degrade_cooldown_s
        self.episodes += 1
        self.consecutive_misses = 0
        self.requested = self.completed = self.failed = 0
        log.warning(
            "JIT auto-degrade: %d consecutive misses with compile completion %.0f%%; "
            "specialisation paused for %.0f s",
            self.config.degrade_min_misses,
            100 * rate,
            self.config.degrade_cooldown_s,
        )
        return True


def strike(state: KeyState, key: Signature, config: JitConfig) -> bool:
    """Record a failed compile; True when the key is now blacklisted (warned once)."""
    state.strikes += 1
    if state.strikes >= config.max_strikes and not state.blacklisted:
        state.blacklisted = True
        log.warning("JIT: %s failed to compile %d times; never trying again", key, state.strikes)
        return True
    return False
