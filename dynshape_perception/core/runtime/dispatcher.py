"""The shape-specialising dispatcher: guard, specialised or generic call, background compiles."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, OrderedDict, deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dynshape_perception.core.runtime.compile_pool import CompilePool
from dynshape_perception.core.runtime.executable import LoadedModel
from dynshape_perception.core.runtime.metrics import CompileEvent, JitMetrics
from dynshape_perception.core.runtime.policy import (
    CostModel,
    DegradeGuard,
    JitConfig,
    KeyState,
    strike,
)
from dynshape_perception.core.runtime.shapes import (
    Signature,
    crop_outputs,
    pad_inputs,
    sample_inputs,
)
from dynshape_perception.models.common import ModelDef

log = logging.getLogger(__name__)

VALIDATION_REPEATS = 3
HIT_LOG_LENGTH = 4096


@dataclass
class Specialisation:
    key: Signature
    model: LoadedModel
    nbytes: int
    speedup: float


class SpecialisationCache:
    """LRU bounded by entry count and by library bytes, counting evictions."""

    def __init__(self, max_entries: int, max_bytes: int, metrics: JitMetrics) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._metrics = metrics
        self._entries: OrderedDict[Signature, Specialisation] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def get(self, key: Signature) -> Specialisation | None:
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
            return entry

    def put(self, entry: Specialisation) -> None:
        with self._lock:
            old = self._entries.pop(entry.key, None)
            if old is not None:
                self._bytes -= old.nbytes
            self._entries[entry.key] = entry
            self._bytes += entry.nbytes
            while len(self._entries) > self.max_entries or (
                self._bytes > self.max_bytes and len(self._entries) > 1
            ):
                _, evicted = self._entries.popitem(last=False)
                self._bytes -= evicted.nbytes
                self._metrics.bump("evictions")

    def keys(self) -> list[Signature]:
        with self._lock:
            return list(self._entries)

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)


class Dispatcher:
    """Calls one model: a specialisation when its guard admits the call, else the generic build.

    Compilation never happens on the calling thread; a finished compile is validated against
    the generic build on a recorded call before it may serve any call (two-phase switch).
    """

    def __init__(
        self,
        model: ModelDef,
        generic: LoadedModel,
        config: JitConfig,
        metrics: JitMetrics,
        pool: CompilePool | None,
        validator: LoadedModel | None = None,
    ) -> None:
        self.model = model
        self.generic = generic
        self.config = config
        self.metrics = metrics
        self.pool = pool
        self.dims = config.dim_policy(model.name)
        self.cache = SpecialisationCache(config.max_entries, config.max_bytes, metrics)
        self.cost = CostModel(config.prior_speedup, config.prior_compile_s, config.horizon_s)
        self.degrade = DegradeGuard(config)
        self.profile: Counter[Signature] = Counter()
        self._keys: dict[Signature, KeyState] = {}
        self._lock = threading.Lock()
        self._frozen = config.mode == "frozen"
        # A second VM over the generic library, so validation never contends with callers.
        self._validator = validator or generic
        self.on_event: Callable[[CompileEvent], None] | None = None
        # Which specialisation served which call, newest last: for diagnostics and audits.
        self.hit_log: deque[tuple[Signature, Signature]] = deque(maxlen=HIT_LOG_LENGTH)

    # -- calling path -------------------------------------------------------------------
    def __call__(self, function: str, *arrays: np.ndarray) -> list[np.ndarray]:
        args = list(arrays)
        dims = self.generic.validate(function, args)
        sig = Signature.of(function, dims)
        started = time.perf_counter()
        with self._lock:
            self.profile[sig] += 1
        if self.config.mode == "off":
            out = self.generic.run_unchecked(function, args)
            self._finish(sig, started, hit=False, accepted=False)
            return out
        key = self.dims.key(sig)
        entry = self.cache.get(key)
        if entry is not None and self.dims.admits(key, sig):
            out = self._run_specialised(entry, function, args, dims)
            self.hit_log.append((key, sig))
            self.degrade.on_hit()
            self._finish(sig, started, hit=True, accepted=True)
            return out
        out = self.generic.run_unchecked(function, args)
        elapsed_ms = (time.perf_counter() - started) * 1000.0
        accepted = self._consider(key, elapsed_ms, args, out)
        if accepted and self.degrade.on_miss():
            self.metrics.bump("degraded_episodes")
        self.metrics.degraded = self.degrade.active
        self._finish(sig, started, hit=False, accepted=accepted)
        return out

    def _run_specialised(
        self, entry: Specialisation, function: str, args: list[np.ndarray], dims: Mapping[str, int]
    ) -> list[np.ndarray]:
        spec = self.model.spec.function(function)
        padded = pad_inputs(spec, args, entry.key.as_dict())
        return crop_outputs(spec, entry.model.run_unchecked(function, padded), dims)

    def _finish(self, sig: Signature, started: float, hit: bool, accepted: bool) -> None:
        ms = (time.perf_counter() - started) * 1000.0
        self.metrics.record_call(self.model.name, sig, ms, hit=hit, accepted=accepted)

    def _consider(
        self, key: Signature, generic_ms: float, args: list[np.ndarray], out: list[np.ndarray]
    ) -> bool:
        """Update the key's measurements; queue a compile when the cost model says it pays."""
        with self._lock:
            state = self._keys.setdefault(key, KeyState())
            state.calls += 1
            now = time.monotonic()
            if state.calls == 1:
                state.first_seen_s = now
            state.last_seen_s = now
            state.generic_ms = (
                generic_ms if state.calls == 1 else 0.8 * state.generic_ms + 0.2 * generic_ms
            )
            if state.blacklisted or state.rejected or self._frozen or self.pool is None:
                return state.accepted
            if state.calls < self.config.threshold or self.degrade.active:
                return state.accepted
            if not state.accepted and self.cost.benefit_ms(state) <= self.config.min_benefit_ms:
                return False
            if not state.accepted and any(v == 0 for _, v in key.dims):
                return False
            state.accepted = True
            if state.sample is None:
                state.sample = [np.array(a, copy=True) for a in args]
            benefit = self.cost.benefit_ms(state)
        if self.pool.submit(self.model.name, key, benefit, self._compiled):
            self.degrade.requested += 1
        return True

    # -- background path ----------------------------------------------------------------
    def _compiled(self, key: Signature, path: str | None, compile_s: float, reason: str) -> None:
        """Runs on a compile-pool thread: validate, measure, then publish (or strike)."""
        now = time.monotonic()
        with self._lock:
            state = self._keys.setdefault(key, KeyState())
            sample = state.sample
        if path is None:
            self._fail(key, state, compile_s, reason)
            return
        self.degrade.completed += 1
        self.cost.observe_compile(compile_s)
        try:
            loaded = LoadedModel(self.model, Path(path))
            speedup = self._validate(key, loaded, sample)
        except Exception as err:  # noqa: BLE001 - a specialisation that fails validation stays out
            self._fail(key, state, compile_s, f"validation failed: {err}")
            return
        self.cost.observe_speedup(speedup)
        if speedup >= self.config.accept_ratio:
            with self._lock:
                state.rejected = True
                state.accepted = False
            self._emit(
                CompileEvent(
                    now,
                    self.model.name,
                    str(key),
                    True,
                    compile_s,
                    f"slower than generic (x{speedup:.2f})",
                ),
                rejected=True,
            )
            return
        nbytes = Path(path).stat().st_size
        self.cache.put(Specialisation(key, loaded, nbytes, speedup))
        self._emit(CompileEvent(now, self.model.name, str(key), True, compile_s))

    def _validate(
        self, key: Signature, loaded: LoadedModel, sample: list[np.ndarray] | None
    ) -> float:
        """Check pinned dims, outputs against the generic build, and the measured speedup."""
        if loaded.model.name != self.model.name:
            raise ValueError("library is for another model")
        if sample is None:
            raise ValueError("no recorded call to validate against")
        args = sample
        function = key.function
        dims = self.model.spec.bind_dims(function, args)
        if not self.dims.admits(key, Signature.of(function, dims)):
            raise ValueError(f"recorded call {dims} is outside the guard of {key}")
        spec = self.model.spec.function(function)
        padded = pad_inputs(spec, args, key.as_dict())
        for arr, tspec in zip(padded, spec.inputs, strict=True):
            want = tspec.resolve(key.as_dict())
            if tuple(arr.shape) != tuple(want):
                raise ValueError(f"padded {tspec.name} is {arr.shape}, specialisation wants {want}")
        got = crop_outputs(spec, loaded.run_unchecked(function, padded), dims)
        ref = self._validator.run_unchecked(function, args)
        for g, r in zip(got, ref, strict=True):
            if g.shape != r.shape or not np.allclose(
                g, r, rtol=self.config.validate_rtol, atol=self.config.validate_atol
            ):
                raise ValueError("specialised outputs differ from the generic build")
        return self._speedup(loaded, function, args, padded)

    def _speedup(
        self, loaded: LoadedModel, function: str, args: list[np.ndarray], padded: list[np.ndarray]
    ) -> float:
        def best(fn: Callable[[], object]) -> float:
            times = []
            for _ in range(VALIDATION_REPEATS):
                t0 = time.perf_counter()
                fn()
                times.append(time.perf_counter() - t0)
            return min(times)

        generic = best(lambda: self._validator.run_unchecked(function, args))
        special = best(lambda: loaded.run_unchecked(function, padded))
        return special / max(generic, 1e-9)

    def _fail(self, key: Signature, state: KeyState, compile_s: float, reason: str) -> None:
        self.degrade.failed += 1
        with self._lock:
            newly = strike(state, key, self.config)
            if state.blacklisted:
                state.accepted = False
        if newly:
            self.metrics.bump("blacklisted")
        self._emit(
            CompileEvent(time.monotonic(), self.model.name, str(key), False, compile_s, reason)
        )

    def _emit(self, event: CompileEvent, rejected: bool = False) -> None:
        self.metrics.record_compile(event, rejected=rejected)
        if self.on_event is not None:
            self.on_event(event)

    # -- warm-up and inspection ---------------------------------------------------------
    def warm(self, keys: Sequence[Signature], seed: int = 0) -> None:
        """Queue compiles for known-hot keys ahead of their first call (warm start).

        Validation uses synthetic inputs of the key's shape, since no call was recorded yet.
        """
        if self.pool is None:
            return
        for key in keys:
            with self._lock:
                state = self._keys.setdefault(key, KeyState())
                if state.blacklisted:
                    continue
                state.accepted = True
                state.sample = sample_inputs(self.model, key.function, key.as_dict(), seed)
            self.pool.submit(self.model.name, key, float("inf"), self._compiled)

    def accepted_keys(self) -> list[Signature]:
        with self._lock:
            return [k for k, s in self._keys.items() if s.accepted and not s.blacklisted]

    def key_state(self, key: Signature) -> KeyState | None:
        with self._lock:
            return self._keys.get(key)

    def freeze(self) -> None:
        """Stop admitting new specialisations (deterministic replay)."""
        self._frozen = True
