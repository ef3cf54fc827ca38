"""JIT policy: configuration, hotness, the measured cost model, strikes and auto-degrade."""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from dynshape_perception.errors import ConfigError
from dynshape_perception.models.common import ModelSpec
from dynshape_perception.paramspec import MAX_COUNT, check_fields, derived, param
from dynshape_perception.runtime.shapes import DimPolicy, Signature
from dynshape_perception.runtime.specialisations import KeyState

log = logging.getLogger(__name__)

MODES = ("off", "frozen", "adaptive")
DEGRADE_MIN_FINISHED = 3
COMPILE_MODES = ("auto", "process", "thread")
# Cache bytes: a terabyte is no bound a vehicle needs.
MAX_BYTES = 1 << 40
# Specialisations judged where they serve before their mean replaces the workers' timing:
# gains differ by shape, and one judged key is no estimate for a function.
IN_PLACE_MIN = 3
# A key's call rate is never read off less time than this: eight calls in one frame, 2 ms
# apart, would otherwise extrapolate to millions over the horizon.
MIN_RATE_SPAN_S = 1.0


@dataclass(frozen=True)
class JitConfig:
    mode: str = param("adaptive", "JIT mode: off, frozen, adaptive", read_only=True, choices=MODES)
    hotness_threshold: int = param(
        8, "calls of one shape before it may be specialised", low=1, high=MAX_COUNT
    )
    inference_profile: bool = derived("set where the shapes are known: bench, verify", False)
    # Bucket edges per model and dim, in place of those its spec declares.
    weak_edges: Mapping[str, Mapping[str, tuple[int, ...]]] = derived(
        "the bucket edges of each model's spec", default_factory=dict
    )
    max_entries: int = param(1024, "specialisations kept per model (LRU)", low=1, high=MAX_COUNT)
    max_bytes: int = param(
        512 * 1024 * 1024,
        "library bytes of specialisations kept per model (LRU)",
        low=1,
        high=MAX_BYTES,
    )
    # The artefact cache root on disk, every model and process sharing it: a long drive
    # compiles new keys for days, and every compiler upgrade strands the old ones.
    disk_max_bytes: int = param(
        2 * 1024 * 1024 * 1024,
        "bytes of the artefact cache on disk, shared by every model and process using "
        "model_cache_dir: least recently used specialisations go first, generic builds last",
        read_only=True,
        low=1,
        high=MAX_BYTES,
    )
    pool_size: int = param(1, "background compile workers", read_only=True, low=1, high=64)
    # Not auto: its trial compiles in a thread beside the lanes for 200 calls, and that
    # thread, at SCHED_IDLE, holds the GIL they wait for.
    compile_mode: str = param(
        "process",
        "compile workers: process (isolated), thread, or auto (picked by the measured "
        "slowdown of live calls, after a trial in each)",
        read_only=True,
        choices=COMPILE_MODES,
    )
    compile_timeout_s: float = param(
        120.0,
        "seconds before a background compile is abandoned",
        read_only=True,
        low=1.0,
        high=3600.0,
    )
    # Workers that imported the compiler and idle this long exit (0: they stay); lean ones
    # take their place.
    worker_idle_s: float = param(
        60.0,
        "seconds a compile worker that has imported the compiler may idle before it exits "
        "and a lean one (no compiler) takes its place; 0: it stays",
        read_only=True,
        low=0.0,
        high=86400.0,
    )
    # The import (an interpreter loading TVM) then runs before serving starts rather than
    # between frames with the first compile, which it delays by seconds.
    start_workers: bool = param(
        False,
        "have the compile workers import the compiler at launch, not with the first "
        "compile: that compile lands seconds sooner, for a worker's memory (about 200 MB) "
        "held until worker_idle_s passes without a compile",
        read_only=True,
    )
    # Between the frames of a saturated input there are a few milliseconds: a compile let
    # run in each would still be running as the next frame starts, beside its first stage.
    # At a lidar's pace the node is idle for most of each period.
    compile_idle_ms: float = param(
        20.0,
        "milliseconds after a node's last frame work before its background compiles run "
        "again (they are stopped while a frame is under way); 0: at once",
        read_only=True,
        low=0.0,
        high=1000.0,
    )
    # In the three-node launch the later nodes idle while the lidar node computes the next
    # scan: their own work alone would let their compiles run beside it.
    host_gate: bool = param(
        True,
        "also stop this node's background compiles while any process of this user on the "
        "host (another node) has frame work under way, and for compile_idle_ms after "
        "(Linux, through /dev/shm)",
        read_only=True,
    )
    max_strikes: int = derived("its default: a tuning constant of the JIT", 3)
    degrade_min_misses: int = derived("its default: a tuning constant of the JIT", 20)
    degrade_completion_rate: float = derived("its default: a tuning constant of the JIT", 0.3)
    degrade_cooldown_s: float = derived("its default: a tuning constant of the JIT", 30.0)
    # Specialise only when the cost model's expected benefit exceeds this.
    min_benefit_ms: float = derived("its default: a tuning constant of the JIT", 0.0)
    # A specialisation serves only if it runs in under this fraction of the generic time: a
    # smaller gain is within timing noise and does not pay for padding.
    accept_ratio: float = derived("its default: a tuning constant of the JIT", 0.95)
    prior_speedup: float = derived("its default: a tuning constant of the JIT", 0.8)
    prior_compile_s: float = derived("its default: a tuning constant of the JIT", 1.5)
    # Calling-path seconds per compile-second until the interference meter has measured it.
    prior_compile_weight: float = derived("its default: a tuning constant of the JIT", 0.5)
    # How far ahead a key's observed call rate is trusted when amortising a compile.
    horizon_s: float = derived("its default: a tuning constant of the JIT", 600.0)
    # Calls expected to take at least this long suspend running compile processes.
    yield_min_ms: float = derived("its default: a tuning constant of the JIT", 1.0)
    validate_rtol: float = derived("its default: a tuning constant of the JIT", 1e-4)
    validate_atol: float = derived("its default: a tuning constant of the JIT", 1e-5)

    def __post_init__(self) -> None:
        check_fields(self, label="jit ")
        if int(self.max_strikes) < 1:
            raise ConfigError(f"jit max_strikes must be >= 1, got {self.max_strikes!r}")
        if self.prior_compile_weight < 0:
            raise ConfigError("prior_compile_weight must be >= 0")
        if not 0.0 <= self.degrade_completion_rate <= 1.0:
            raise ConfigError("degrade_completion_rate must lie in [0, 1]")
        if self.horizon_s <= 0:
            raise ConfigError(f"jit horizon_s must be > 0, got {self.horizon_s!r}")
        if self.degrade_cooldown_s < 0:
            raise ConfigError("degrade_cooldown_s must be >= 0")
        # A NaN compares false with everything, so it would pass the checks above and below.
        for name in (
            "degrade_cooldown_s",
            "min_benefit_ms",
            "accept_ratio",
            "prior_speedup",
            "prior_compile_s",
            "prior_compile_weight",
            "horizon_s",
            "yield_min_ms",
            "validate_rtol",
            "validate_atol",
        ):
            if not math.isfinite(float(getattr(self, name))):
                raise ConfigError(f"jit {name} must be finite, got {getattr(self, name)!r}")
        if self.accept_ratio <= 0 or self.prior_speedup <= 0 or self.prior_compile_s < 0:
            raise ConfigError(
                "jit accept_ratio and prior_speedup must be > 0 and prior_compile_s >= 0"
            )
        if self.validate_rtol < 0 or self.validate_atol < 0 or self.yield_min_ms < 0:
            raise ConfigError("jit validate_rtol, validate_atol and yield_min_ms must be >= 0")

    @property
    def threshold(self) -> int:
        """Calls before a shape is hot: 3 in an inference profile, where shapes are known."""
        return min(3, self.hotness_threshold) if self.inference_profile else self.hotness_threshold

    def dim_policy(self, spec: ModelSpec) -> DimPolicy:
        """The bucket edges the model declares, or this config's for it."""
        edges = self.weak_edges.get(spec.model, spec.bucket_edges)
        return DimPolicy({k: tuple(v) for k, v in edges.items()})

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> JitConfig:
        known = set(cls.__dataclass_fields__)
        unknown = set(raw) - known
        if unknown:
            raise ConfigError(f"unknown jit settings: {sorted(unknown)}")
        values = dict(raw)
        try:
            if "weak_edges" in values:
                values["weak_edges"] = {
                    m: {d: tuple(int(x) for x in e) for d, e in dims.items()}
                    for m, dims in values["weak_edges"].items()
                }
            return cls(**values)
        # A setting of the wrong type (a string threshold, edges that are not lists).
        except (TypeError, ValueError, AttributeError, ConfigError) as err:
            raise ConfigError(f"invalid jit settings: {err}") from err


class InterferenceMeter:
    """What a background compile costs the calling path, measured on live calls.

    Each generic call is timed against its key's idle baseline. Per compile mode, the time
    calls took while a compile of that mode ran, over what their baselines predicted, against
    the same ratio while none ran, is that mode's slowdown: weighted by time, so that a slowed
    point cloud counts for more than a slowed prediction. Times the share of wall
    time the calling path is busy, it gives the calling-path seconds one compile-second
    costs. Until both sides have ``min_samples`` calls, the prior stands.
    """

    def __init__(
        self,
        prior_weight: float,
        min_samples: int = 20,
        busy_s: Callable[[], float] = lambda: 0.0,
    ) -> None:
        self.prior_weight = prior_weight
        self.min_samples = min_samples
        # Seconds the calling path has been busy, read from the dispatchers' tallies.
        self._busy = busy_s
        # Keyed by the compile mode running during the call; None: no compile ran.
        self._took: dict[str | None, float] = {}
        self._baseline: dict[str | None, float] = {}
        self._n: dict[str | None, int] = {}
        self._started = time.monotonic()
        self._lock = threading.Lock()

    def observe(self, took_s: float, baseline_s: float, compiling: str | None) -> None:
        with self._lock:
            # Past 10x a call was preempted by another process, not slowed by a compile.
            if baseline_s > 0.0 and 0.0 < took_s < 10.0 * baseline_s:
                self._took[compiling] = self._took.get(compiling, 0.0) + took_s
                self._baseline[compiling] = self._baseline.get(compiling, 0.0) + baseline_s
                self._n[compiling] = self._n.get(compiling, 0) + 1

    def samples(self, mode: str | None) -> int:
        with self._lock:
            return self._n.get(mode, 0)

    def slowdown(self, mode: str) -> float | None:
        with self._lock:
            if min(self._n.get(mode, 0), self._n.get(None, 0)) < self.min_samples:
                return None
            busy = self._took[mode] / self._baseline[mode]
            idle = self._took[None] / self._baseline[None]
            return max(0.0, busy / idle - 1.0)

    @property
    def utilisation(self) -> float:
        return min(1.0, self._busy() / max(time.monotonic() - self._started, 1e-3))

    def weight(self, mode: str) -> float:
        """Calling-path seconds per compile-second of ``mode``."""
        slowdown = self.slowdown(mode)
        if slowdown is None:
            return self.prior_weight
        return slowdown * self.utilisation

    def snapshot(self, mode: str) -> dict[str, Any]:
        with self._lock:
            modes = sorted(m for m in self._n if m is not None)
        slowdowns = {m: self.slowdown(m) for m in modes}
        return {
            "compile_slowdown": {m: v if v is None else round(v, 4) for m, v in slowdowns.items()},
            "calls_while_compiling": {m: self.samples(m) for m in modes},
            "calls_while_idle": self.samples(None),
            "utilisation": round(self.utilisation, 4),
            "compile_cost_weight": round(self.weight(mode), 4),
        }


class CostModel:
    """benefit = expected calls x (generic - specialised ms) - compile cost, all measured.

    Expected future calls are the key's observed call rate times ``horizon_s`` (a shape that
    was hot stays hot for the horizon), and never fewer than the calls seen so far; the
    specialised latency is the generic one times the measured speedup of earlier
    specialisations of the same function; the compile cost is the measured mean compile time
    times what a compile-second costs the calling path (``compile_weight``, measured by an
    ``InterferenceMeter``; 1.0 charges background compiles as if they ran on the caller).

    ``floor`` is the least speedup any specialisation of the function can reach, known before
    any is built: 1.0 where its generic build's kernels are all templates or scheduled by hand
    (``ScheduleReport.shape_invariant``), so that no compile is spent to find out.
    """

    def __init__(
        self,
        prior_speedup: float,
        prior_compile_s: float,
        horizon_s: float,
        compile_weight: Callable[[], float] = lambda: 1.0,
        accept_ratio: float = 1.0,
        floor: float = 0.0,
    ) -> None:
        self.horizon_s = horizon_s
        self.accept_ratio = accept_ratio
        self.floor = floor
        self.validated_speedup = prior_speedup
        self.in_place_speedup: float | None = None
        self.compile_s = prior_compile_s
        self.compile_weight = compile_weight
        self._speedups = 0
        self._in_place = 0
        self._compiles = 0
        # Compile-pool threads report builds while a calling thread reports a judgement: each
        # running mean is a count and a value updated together.
        self._lock = threading.Lock()

    @property
    def measured(self) -> bool:
        """True once a specialisation of this function has been timed."""
        return self._speedups > 0 or self._in_place > 0

    @property
    def settled(self) -> bool:
        """True once enough specialisations were judged where they serve to trust their mean."""
        return self._in_place >= IN_PLACE_MIN

    @property
    def speedup(self) -> float:
        """Specialised over generic time, as expected where calls run.

        A worker times both builds warm and back to back; in a stream, each call after a
        point cloud or an idle gap finds caches cold, and that fixed cost dilutes the gain
        about twofold. Once a specialisation has been judged where it serves, that is the
        estimate: the worker's timing would have accepted compiles that never pay back.
        """
        if self.in_place_speedup is not None and self.settled:
            return max(self.floor, self.in_place_speedup)
        return max(self.floor, self.validated_speedup)

    def observe_speedup(self, ratio: float) -> None:
        """A worker's timing of a fresh specialisation against the generic build."""
        with self._lock:
            self._speedups += 1
            self.validated_speedup += (ratio - self.validated_speedup) / min(self._speedups, 10)

    def observe_in_place(self, ratio: float) -> None:
        """A specialisation's mean served latency over its key's generic latency."""
        with self._lock:
            self._in_place += 1
            prev = self.in_place_speedup if self.in_place_speedup is not None else ratio
            self.in_place_speedup = prev + (ratio - prev) / min(self._in_place, 10)

    def snapshot(self) -> dict[str, Any]:
        """What the model believes now: for reports, not for decisions."""
        return {
            "speedup": round(self.speedup, 4),
            "floor": self.floor,
            "validated_speedup": round(self.validated_speedup, 4),
            "validated": self._speedups,
            "in_place_speedup": (
                None if self.in_place_speedup is None else round(self.in_place_speedup, 4)
            ),
            "judged_in_place": self._in_place,
            "compile_s": round(self.compile_s, 4),
            "compile_weight": round(self.compile_weight(), 4),
        }

    def observe_compile(self, seconds: float) -> None:
        """A build's time; not one fetched from the artefact cache, which costs no compile."""
        with self._lock:
            self._compiles += 1
            self.compile_s += (seconds - self.compile_s) / min(self._compiles, 10)

    def can_pay(self, min_benefit_ms: float) -> bool:
        """Whether any key's benefit may ever exceed ``min_benefit_ms``. Not where the floor
        misses the acceptance ratio: every benefit is then a compile's cost, never positive."""
        return self.floor < self.accept_ratio or min_benefit_ms < 0.0

    def expected_calls(self, state: KeyState) -> float:
        if state.calls < 2:
            return float(state.calls)
        span = max(state.last_seen_s - state.first_seen_s, MIN_RATE_SPAN_S)
        return max(float(state.calls), (state.calls - 1) / span * self.horizon_s)

    def benefit_ms(self, state: KeyState) -> float:
        speedup = self.speedup
        # A specialisation expected to miss the acceptance ratio would never serve a call.
        if speedup >= self.accept_ratio:
            return -self.compile_s * 1000.0 * self.compile_weight()
        # The prior and the workers' timings are warm ratios: they apply to the key's warm
        # latency. The rest of a call in the stream is refetching what other calls evicted,
        # which a specialisation, a library of its own, pays as well. An in-place ratio was
        # measured in the stream, so it applies to the stream's latency.
        in_place = self.in_place_speedup is not None and self.settled
        base = state.generic_ms if in_place or state.fastest_ms <= 0.0 else state.fastest_ms
        saved = min(base, state.generic_ms) * (1.0 - speedup)
        return self.expected_calls(state) * saved - self.compile_s * 1000.0 * self.compile_weight()


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
        # Compile-pool threads count outcomes while the settling thread counts misses and
        # resets all of them when an episode starts.
        self._lock = threading.Lock()

    @property
    def active(self) -> bool:
        return time.monotonic() < self.until

    def count(self, outcome: str) -> None:
        """One compile ``requested``, ``completed`` or ``failed``."""
        with self._lock:
            setattr(self, outcome, getattr(self, outcome) + 1)

    def on_hit(self) -> None:
        # Hits and misses are settled by one thread at a time, and no other writer touches
        # this count: no lock on every settled hit.
        self.consecutive_misses = 0

    def on_miss(self) -> bool:
        """Count a miss of an accepted key; True when this miss starts a degrade episode."""
        with self._lock:
            self.consecutive_misses += 1
            if self.active or self.consecutive_misses < self.config.degrade_min_misses:
                return False
            # Judge finished compiles only: a queue still being worked off is not a failure,
            # but compiles that keep failing or timing out make every miss futile.
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
