"""The shape-specialising dispatcher: guard, specialised or generic call, background compiles."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Mapping, Sequence
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from dynshape_perception.models.common import ModelDef
from dynshape_perception.runtime.bookkeeper import Bookkeeper
from dynshape_perception.runtime.compile_pool import CompilePool
from dynshape_perception.runtime.executable import LoadedModel
from dynshape_perception.runtime.metrics import (
    CallTally,
    CompileEvent,
    JitMetrics,
    LatencyStats,
    ewma,
)
from dynshape_perception.runtime.policy import (
    IN_PLACE_MIN,
    CostModel,
    DegradeGuard,
    JitConfig,
    strike,
)
from dynshape_perception.runtime.shapes import (
    Padding,
    Signature,
    sample_inputs,
)
from dynshape_perception.runtime.specialisations import (
    KeyState,
    ShapeRecord,
    Specialisation,
    SpecialisationCache,
    check_sidecar,
)
from dynshape_perception.runtime.validation import CompileRequest, CompileResult

log = logging.getLogger(__name__)

HIT_LOG_LENGTH = 4096
JUDGE_HITS = 64
# A specialisation not judged this long after it went live is too rare to judge soon, and
# stops holding one of its function's trial slots (see Dispatcher._trial_full).
TRIAL_PATIENCE_S = 30.0
# A hot key the cost model declined is reconsidered every this many calls, not on each.
RECONSIDER_EVERY = 8
# A record per distinct signature holds its profile count and latency; past this many, those
# seen once are dropped, since point counts never repeat and would grow the table every frame.
PROFILE_MAX = 65536
MIXED = "mixed"
# With a bookkeeper, this many queued calls ring it before its next poll; past INBOX_MAX the
# caller settles them itself, since a stalled bookkeeper must not let the queue grow unbounded.
RING_AT = 64
INBOX_MAX = 4096
# What a queued call record is: generic while specialising, a hit, generic with the JIT off.
MISS, HIT, OFF = 0, 1, 2


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
        bookkeeper: Bookkeeper | None = None,
        shape_invariant: bool = False,
    ) -> None:
        """``shape_invariant``: the generic build's sidecar says a specialisation of it would
        compile the same loops, so none can be faster and none is compiled to find out."""
        self.model = model
        self.generic = generic
        self.shape_invariant = shape_invariant
        self.config = config
        self.metrics = metrics
        self.pool = pool
        policy = config.dim_policy(model.spec).within(model.spec.bounds)
        self._dims = {fn.name: policy.for_function(fn) for fn in model.spec.functions}
        self._specs = {fn.name: fn for fn in model.spec.functions}
        self.cache = SpecialisationCache(
            config.max_entries, config.max_bytes, metrics, self._unlink
        )
        self._costs = {
            fn.name: CostModel(
                config.prior_speedup,
                config.prior_compile_s,
                config.horizon_s,
                (lambda: pool.meter.weight(pool.mode)) if pool is not None else (lambda: 1.0),
                config.accept_ratio,
                floor=1.0 if shape_invariant else 0.0,
            )
            for fn in model.spec.functions
        }
        # Compiles queued or running per function: until one specialisation of a function has
        # been timed, its speedup is a guess, so only one compile at a time tests the guess.
        self._outstanding: Counter[str] = Counter()
        # Live specialisations awaiting their judgement in place, per function, with when they
        # went live: until a function has been judged IN_PLACE_MIN times, no more compiles start
        # than leave that many on trial, since the worker's warm timing overstates the gain.
        self._trials: dict[str, dict[Signature, float]] = {
            fn.name: {} for fn in model.spec.functions
        }
        self.degrade = DegradeGuard(config)
        self.shape_counts_dropped = 0
        self._keys: dict[Signature, KeyState] = {}
        # Mean generic latency per function: the yield decision for a key not seen before.
        self._function_ms: dict[str, float] = {}
        self._threshold = config.threshold
        # Keyed by (function, *dim values) in the spec's order: no sorting on a repeat call.
        self._shapes: dict[tuple[object, ...], ShapeRecord] = {}
        self._lock = threading.Lock()
        # This dispatcher's calls, hits and busy time: the metrics object sums the tallies.
        self.tally = CallTally()
        # Each call queues what it measured; the rest of its bookkeeping (profile, cost model,
        # interference meter, compile requests) is settled by the bookkeeper's thread, or by
        # a reader, which settles first so that it sees every call made before its read.
        self._inbox: deque[tuple[Any, ...]] = deque()
        self._settling = threading.Lock()
        self._ring = bookkeeper.ring if bookkeeper is not None else None
        self._settle_at = RING_AT if bookkeeper is not None else 1
        if bookkeeper is not None:
            bookkeeper.add(self.settle)
        metrics.add_source(model.name, self._latency_rows, self.tally, self.settle)
        if pool is not None:
            pool.add_feeder(self.settle)
        self._frozen = config.mode == "frozen"
        # Set by ``freeze``: a build landing after it is dropped, so that outputs never depend
        # on when a background compile finished.
        self._sealed = False
        # Frozen replays must not depend on timing: what warm-up builds and validates serves,
        # however it timed, and is never demoted by its in-place timing.
        self._deterministic = config.mode == "frozen"
        self._off = config.mode == "off"
        self.on_event: Callable[[CompileEvent], None] | None = None
        # Which specialisation served which call, newest last: for diagnostics and audits.
        self._hit_log: deque[tuple[Signature, Signature]] = deque(maxlen=HIT_LOG_LENGTH)
        # Per call in call order, once settled and while tracing (benchmarks): served by a
        # specialisation, its key accepted, its key ever decided (accepted, rejected, failed).
        self.trace: list[tuple[bool, bool, bool]] | None = None

    # -- calling path -------------------------------------------------------------------
    def __call__(self, function: str, *arrays: np.ndarray) -> list[np.ndarray]:
        args = list(arrays)
        dims = self.generic.validate(function, args)
        started = time.perf_counter()
        memo = (function, *dims.values())
        shape = self._shapes.get(memo) or self._new_shape(memo, function, dims)
        if self._off:
            out = self.generic.run_unchecked(function, args)
            self._post((OFF, shape, (time.perf_counter() - started) * 1000.0))
            return out
        entry = shape.state.entry if shape.admitted else None
        if entry is not None:
            if entry.live:
                entry.last_used = started
            else:
                entry = None
        # Only heavy calls stop the compile workers; a light call skips the context manager.
        # Read without the pool's lock: a compile that starts during a call this read let pass
        # costs that call one yield, not its correctness.
        pool = self.pool
        if pool is None or not pool.busy or not self._heavy(pool, shape):
            return self._serve(function, args, dims, shape, entry, started)
        with pool.yielding():
            return self._serve(function, args, dims, shape, entry, started)

    def _serve(
        self,
        function: str,
        args: list[np.ndarray],
        dims: Mapping[str, int],
        shape: ShapeRecord,
        entry: Specialisation | None,
        started: float,
    ) -> list[np.ndarray]:
        if entry is not None:
            out = self._run_specialised(entry, shape, function, args, dims)
            ms = (time.perf_counter() - started) * 1000.0
            # Judged here, not when settled: a demoted specialisation serves no call after it.
            self._judge(entry, ms)
            self._post((HIT, shape, ms))
            return out
        pool = self.pool
        before = pool.compiling_now() if pool is not None and pool.busy else None
        out = self.generic.run_unchecked(function, args)
        after = pool.compiling_now() if pool is not None and pool.busy else None
        # A compile that started, ended or yielded mid-call belongs to neither side.
        compiling = before if before == after else MIXED
        finished = time.perf_counter()
        # Copied here, not when settled: the caller may refill its arrays once the call returns.
        state = shape.state
        arrivals = state.arrivals = state.arrivals + 1
        sample = (
            [np.array(a, copy=True) for a in args]
            if state.want_sample
            or (arrivals == self._threshold and self._may_compile(function, state))
            else None
        )
        inbox = self._inbox
        inbox.append((MISS, shape, (finished - started) * 1000.0, compiling, finished, sample))
        if len(inbox) >= self._settle_at:
            self._hand_over()
        return out

    def _may_compile(self, function: str, state: KeyState) -> bool:
        """Whether settling a call of ``function`` could queue a compile of its key. If not, no
        sample of its inputs is copied: a point cloud's copy is megabytes."""
        if self.pool is None or self._frozen:
            return False
        return state.accepted or self._costs[function].can_pay(self.config.min_benefit_ms)

    def _post(self, record: tuple[Any, ...]) -> None:
        inbox = self._inbox
        inbox.append(record)
        if len(inbox) >= self._settle_at:
            self._hand_over()

    def _hand_over(self) -> None:
        """The queue is long enough to settle: ring the bookkeeper, or settle here without one
        (or past ``INBOX_MAX``, with one that does not keep up)."""
        if self._ring is None or len(self._inbox) > INBOX_MAX:
            self.settle()
        else:
            self._ring(self.settle)

    def settle(self) -> None:
        """Apply the queued call records in call order, on the bookkeeper's thread or a
        reader's. Never called under this dispatcher's lock, which settling takes."""
        with self._settling:
            inbox = self._inbox
            if not inbox:
                return
            trace = self.trace
            # The degraded flag each settled miss leaves: published once, for the last of them.
            degraded: bool | None = None
            try:
                while inbox:
                    record = inbox.popleft()
                    kind = record[0]
                    shape = record[1]
                    if kind == MISS:
                        degraded = self._settle_miss(
                            shape, record[2], record[3], record[4], record[5]
                        )
                    elif kind == HIT:
                        self._settle_hit(shape, record[2])
                    else:
                        self._count(shape, record[2], hit=False)
                    if trace is not None:
                        state = shape.state
                        decided = state.accepted or state.rejected or state.blacklisted
                        trace.append((kind == HIT, kind == HIT or state.accepted, decided))
            finally:
                if degraded is not None:
                    self.metrics.set_degraded(self.model.name, degraded)

    def _settle_hit(self, shape: ShapeRecord, ms: float) -> None:
        self._hit_log.append((shape.key, shape.sig))
        self.degrade.on_hit()
        self._count(shape, ms, hit=True)

    def _settle_miss(
        self,
        shape: ShapeRecord,
        elapsed_ms: float,
        compiling: str | None,
        finished: float,
        sample: list[np.ndarray] | None,
    ) -> bool:
        """Settle a generic-served call; returns whether specialising is degraded after it."""
        degraded = self.degrade.active
        with self._lock:
            accepted, request = self._consider(
                shape, elapsed_ms, sample, compiling, degraded, finished
            )
            self.tally.add(shape.latency, elapsed_ms, hit=False, accepted=accepted)
        if request is not None:
            self._submit(*request)
        if accepted and self.degrade.on_miss():
            self.metrics.bump("degraded_episodes")
            degraded = True
        return degraded

    def _new_shape(
        self, memo: tuple[object, ...], function: str, dims: Mapping[str, int]
    ) -> ShapeRecord:
        """The record of a signature not seen (or pruned) before: sorting and bucketing its
        dims happens here, once, not on every call."""
        sig = Signature.of(function, dims)
        policy = self._dims[function]
        key = policy.key(sig)
        if len(self._shapes) >= PROFILE_MAX:
            # Pruning goes by call counts: queued calls must be in them, or a hot signature
            # whose calls are still queued would look seen once and be dropped.
            self.settle()
        with self._lock:
            shape = self._shapes.get(memo)
            if shape is None:
                if len(self._shapes) >= PROFILE_MAX:
                    self._prune_shapes()
                state = self._keys.setdefault(key, KeyState())
                shape = self._shapes[memo] = ShapeRecord(sig, key, policy.admits(key, sig), state)
        return shape

    def _prune_shapes(self) -> None:
        """Drop the signatures seen once (or, if none, the less called half); under the lock."""
        counts = sorted(s.latency.calls for s in self._shapes.values())
        floor = 1 if counts[0] <= 1 else counts[len(counts) // 2]
        cold = [memo for memo, s in self._shapes.items() if s.latency.calls <= floor]
        for memo in cold:
            del self._shapes[memo]
        # Exact keys (packed histories, association sizes) are as many as their signatures:
        # a key state nothing is known of goes with its last signature.
        live = {s.key for s in self._shapes.values()}
        for key, state in list(self._keys.items()):
            if key in live or state.entry is not None or state.strikes:
                continue
            if not (state.accepted or state.rejected or state.blacklisted):
                del self._keys[key]
        self.shape_counts_dropped += len(cold)
        self.metrics.bump("latency_signatures_dropped", len(cold))

    def _unlink(self, entry: Specialisation) -> None:
        """Under the cache's lock: the key state lets go of an evicted or demoted entry.

        One attribute store, atomic without this dispatcher's lock, which is never taken
        inside the cache's.
        """
        state = self._keys.get(entry.key)
        if state is not None and state.entry is entry:
            state.entry = None
            # Only its own trial: a successor put in its place has started a new one.
            self._trials[entry.key.function].pop(entry.key, None)

    def _latency_rows(self) -> list[tuple[Signature, LatencyStats]]:
        self.settle()
        with self._lock:
            return [(s.sig, s.latency) for s in self._shapes.values()]

    def _heavy(self, pool: CompilePool, shape: ShapeRecord) -> bool:
        """Calls expected to take ``yield_min_ms`` or more suspend a running compile."""
        if not pool.can_yield:
            return False
        state = shape.state
        if state.calls:
            expected = state.generic_ms
        else:
            expected = self._function_ms.get(shape.key.function, 0.0)
        return expected >= self.config.yield_min_ms

    def _judge(self, entry: Specialisation, ms: float) -> None:
        """Demote a specialisation that is not faster where it runs.

        Validation times it warm and alone; among other shapes' calls, with padding and
        cropping, a small gain can vanish. After ``JUDGE_HITS`` hits its mean latency is
        held against the generic latency its key had before it existed.
        """
        entry.hits += 1
        entry.hit_ms += ms
        if entry.hits < JUDGE_HITS or entry.judged or self._deterministic:
            return
        # Callers on several threads pass the count together (or, losing an increment, never
        # see it equal): the flag, set under the lock, makes one of them the judge.
        with self._lock:
            if entry.judged:
                return
            entry.judged = True
        self._trials[entry.key.function].pop(entry.key, None)
        state = self._keys.get(entry.key)
        if state is None or state.idle_ms <= 0.0:
            return
        ratio = entry.hit_ms / entry.hits / state.idle_ms
        self._costs[entry.key.function].observe_in_place(ratio)
        if ratio < self.config.accept_ratio:
            return
        self.cache.drop(entry.key)
        self._reject(state)
        self.metrics.bump("demoted")
        event = CompileEvent(
            time.monotonic(),
            self.model.name,
            str(entry.key),
            True,
            0.0,
            f"demoted: x{ratio:.2f} of generic where it runs",
        )
        self.metrics.record_event(event)
        if self.on_event is not None:
            self.on_event(event)

    def _run_specialised(
        self,
        entry: Specialisation,
        shape: ShapeRecord,
        function: str,
        args: list[np.ndarray],
        dims: Mapping[str, int],
    ) -> list[np.ndarray]:
        padding = shape.padding
        if padding is None:
            # Two callers may plan at once; both plans are the same.
            padding = shape.padding = Padding(self._specs[function], dims, shape.key.as_dict())
        return padding.around(partial(entry.model.run_unchecked, function), args)

    def _count(self, shape: ShapeRecord, ms: float, hit: bool) -> None:
        with self._lock:
            self.tally.add(shape.latency, ms, hit=hit, accepted=hit)

    def _consider(
        self,
        shape: ShapeRecord,
        generic_ms: float,
        sample: list[np.ndarray] | None,
        compiling: str | None,
        degraded: bool,
        now: float,
    ) -> tuple[bool, tuple[CompileRequest, float] | None]:
        """Under the lock: update the key's measurements; whether the key is accepted, and the
        compile (with its benefit) to queue when the cost model says it pays."""
        key = shape.key
        state = shape.state
        calls = state.calls = state.calls + 1
        if calls == 1:
            state.first_seen_s = now
        state.last_seen_s = now
        state.generic_ms = ewma(state.generic_ms if calls > 1 else None, generic_ms)
        if state.fastest_ms <= 0.0 or generic_ms < state.fastest_ms:
            state.fastest_ms = generic_ms
        self._function_ms[key.function] = ewma(self._function_ms.get(key.function), generic_ms)
        pool = self.pool
        if pool is None:
            return state.accepted, None
        self._observe_interference(pool, state, generic_ms, compiling)
        if state.blacklisted or state.rejected or self._frozen:
            return state.accepted, None
        if calls < self._threshold or degraded:
            return state.accepted, None
        cost = self._costs[key.function]
        if not state.accepted:
            due = state.calls - self._threshold
            if due % RECONSIDER_EVERY:
                return False, None
            if cost.benefit_ms(state) <= self.config.min_benefit_ms:
                return False, None
            if any(v == 0 for _, v in key.dims):
                return False, None
            if not cost.measured and self._outstanding[key.function]:
                return False, None
            if not cost.settled and self._trial_full(key.function, now):
                return False, None
        elif state.entry is not None or pool.in_flight(self.model.name, key):
            # Published or compiling: a miss settled after its compile landed (the call began
            # before, or its record waited in the inbox) must not build the key again.
            return True, None
        state.accepted = True
        if state.sample is None:
            if sample is None:
                state.want_sample = True
                return True, None
            state.sample = sample
        state.want_sample = False
        return True, (self._request(key, state.sample), cost.benefit_ms(state))

    def _trial_full(self, function: str, now: float) -> bool:
        """Under the lock: as many compiles of ``function`` queued, running or live but not
        yet judged as it takes to judge it in place."""
        trials = self._trials[function]
        for key, since in list(trials.items()):
            if now - since > TRIAL_PATIENCE_S:
                trials.pop(key, None)
        return self._outstanding[function] + len(trials) >= IN_PLACE_MIN

    def _submit(self, request: CompileRequest, benefit: float) -> None:
        """Outside this dispatcher's lock, which the next caller may be waiting for."""
        if self._queue(request, benefit):
            self.degrade.count("requested")

    def _queue(self, request: CompileRequest, benefit: float) -> bool:
        """Counted outstanding before it is queued: a compile that fails at once must find
        itself counted, or its count would outlive it and block the function's next trial."""
        assert self.pool is not None
        function = request.key.function
        with self._lock:
            self._outstanding[function] += 1
        if self.pool.submit(request, benefit, self._compiled):
            return True
        with self._lock:
            self._outstanding[function] -= 1
        return False

    @staticmethod
    def _observe_interference(
        pool: CompilePool, state: KeyState, generic_ms: float, compiling: str | None
    ) -> None:
        """Feed the interference meter: this call's time against the key's idle baseline."""
        # Without a baseline yet the meter has nothing to compare: not worth its lock.
        if compiling != MIXED and state.idle_ms > 0.0:
            pool.meter.observe(generic_ms / 1000.0, state.idle_ms / 1000.0, compiling)
        # A key's first call pays one-off costs (allocation, cold caches): not a baseline.
        if compiling is None and state.calls > 1:
            state.idle_ms = ewma(state.idle_ms or None, generic_ms)

    def _request(self, key: Signature, sample: list[np.ndarray] | None) -> CompileRequest:
        assert self.pool is not None
        return CompileRequest(
            model=self.model.name,
            profile=self.pool.profile,
            key=key,
            cache_root=self.pool.cache_root,
            cache_max_bytes=self.pool.cache_max_bytes,
            weak_edges=dict(self._dims[key.function].weak_edges),
            sample=sample,
            rtol=self.config.validate_rtol,
            atol=self.config.validate_atol,
        )

    # -- background path ----------------------------------------------------------------
    def _compiled(
        self, key: Signature, result: CompileResult | None, compile_s: float, reason: str
    ) -> None:
        """Runs on a compile-pool thread once the worker built and validated: publish or strike.

        The worker checked outputs and timed both builds (phase one); here the library is
        loaded and switched in only if it is faster (phase two).
        """
        now = time.monotonic()
        cost = self._costs[key.function]
        with self._lock:
            state = self._keys.setdefault(key, KeyState())
            self._outstanding[key.function] = max(0, self._outstanding[key.function] - 1)
        if result is None:
            self._fail(key, state, compile_s, reason)
            return
        if result.disk_evictions:
            self.metrics.bump("disk_evictions", result.disk_evictions)
        # Demoted while this build ran: that verdict, from serving, outweighs a fresh timing.
        demoted = state.rejected and not self._deterministic
        if self._sealed or demoted:
            reason = "landed after the freeze" if self._sealed else "key demoted meanwhile"
            event = CompileEvent(now, self.model.name, str(key), True, compile_s, reason)
            self._emit(event, rejected=True)
            return
        self.degrade.count("completed")
        if not result.cache_hit:
            cost.observe_compile(compile_s)
        speedup = result.speedup
        cost.observe_speedup(speedup)
        if speedup >= self.config.accept_ratio and not self._deterministic:
            self._reject(state)
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
        try:
            check_sidecar(Path(result.path), self.model.name, key)
            loaded = LoadedModel(self.model, Path(result.path), functions=(key.function,))
            nbytes = Path(result.path).stat().st_size
        except Exception as err:  # noqa: BLE001 - a library that fails to load stays out
            self._fail(key, state, compile_s, f"load failed: {err}")
            return
        entry = Specialisation(key, loaded, nbytes, speedup)
        with self._lock:
            self._trials[key.function][key] = time.perf_counter()
            # A point cloud's copy need not live as long as its key: once evicted, the key's
            # next miss records a fresh one.
            state.sample = None
        # Linked before the put, so that an eviction the put (or a racing one) makes unlinks it.
        state.entry = entry
        self.cache.put(entry)
        reason = "from the artefact cache" if result.cache_hit else ""
        self._emit(CompileEvent(now, self.model.name, str(key), True, compile_s, reason))

    def _reject(self, state: KeyState) -> None:
        """Never specialise this key again (slower at validation, or where it served); its
        sample is no longer needed."""
        with self._lock:
            state.rejected = True
            state.accepted = False
            state.sample = None

    def _fail(self, key: Signature, state: KeyState, compile_s: float, reason: str) -> None:
        self.degrade.count("failed")
        with self._lock:
            newly = strike(state, key, self.config)
            if state.blacklisted:
                state.accepted = False
                state.sample = None
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
    def warm(self, signatures: Sequence[Signature], seed: int = 0) -> int:
        """Queue compiles of the keys of known-hot signatures ahead of their first call (warm
        start); returns how many were queued.

        No call was recorded yet: each key is checked and timed on synthetic inputs of its
        signature, as a live compile is on the call that made its key hot, so a signature
        below its key's edges is checked through the padding it will be served with.
        """
        if self.pool is None:
            return 0
        queued = 0
        for sig in signatures:
            key = self.key_of(sig)
            with self._lock:
                state = self._keys.setdefault(key, KeyState())
                if state.blacklisted:
                    continue
                state.accepted = True
                state.sample = sample_inputs(self.model, sig.function, sig.as_dict(), seed)
                request = self._request(key, state.sample)
            queued += self._queue(request, float("inf"))
        return queued

    @property
    def hit_log(self) -> deque[tuple[Signature, Signature]]:
        """(key, signature) of the calls specialisations served, newest last."""
        self.settle()
        return self._hit_log

    def shape_counts(self) -> Counter[Signature]:
        """A copy of the calls per signature, safe while other threads call."""
        return Counter({sig: row.calls for sig, row in self._latency_rows() if row.calls})

    def key_of(self, signature: Signature) -> Signature:
        """The specialisation key a call of ``signature`` is served by."""
        return self._dims[signature.function].key(signature)

    def cost_snapshot(self) -> dict[str, dict[str, Any]]:
        """Each function's cost-model beliefs: what its compile decisions rested on."""
        self.settle()
        return {name: cost.snapshot() for name, cost in self._costs.items()}

    def accepted_keys(self) -> list[Signature]:
        self.settle()
        with self._lock:
            return [k for k, s in self._keys.items() if s.accepted and not s.blacklisted]

    def key_state(self, key: Signature) -> KeyState | None:
        self.settle()
        with self._lock:
            return self._keys.get(key)

    def freeze(self) -> None:
        """Stop admitting new specialisations (deterministic replay): none is queued from now
        on, and a build still running or queued is dropped when it lands."""
        self.settle()
        self._frozen = True
        self._sealed = True

    def reconfigure(self, config: JitConfig) -> None:
        """Take the settings a running node may change (hotness, the cache's bounds)."""
        self.config = config
        self._threshold = config.threshold
        self.cache.resize(config.max_entries, config.max_bytes)
