"""The executors' common part: submission, lanes, accounting, cost estimates and shutdown."""

from __future__ import annotations

import inspect
import itertools
import logging
import os
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Generator, Iterable, Sequence
from concurrent.futures import CancelledError, Future
from typing import Any, Self, cast

import numpy as np

from dynshape_perception.errors import ConfigError, SchedulingError
from dynshape_perception.scheduling.allocator import keep_freed_memory
from dynshape_perception.scheduling.blas import set_blas_threads, set_opencv_threads
from dynshape_perception.scheduling.tiers import TIERS, Tier, TierConfig, as_tier
from dynshape_perception.scheduling.work import (
    COST_SMOOTHING,
    DROP_REASONS,
    TROUBLE,
    Arrival,
    CostKey,
    ExecutorOptions,
    JobFn,
    Lane,
    PoolControl,
    TierStats,
    Window,
    Work,
    WorkGate,
    size_bucket,
)
from dynshape_perception.stats import percentile_or_none, percentiles_or_none

log = logging.getLogger(__name__)


class ExecutorBase:
    """Submission, accounting, workers and shutdown; subclasses own the queue policy."""

    kind = "base"
    # Whether queued tier-1 work boosts the shared lanes, and whether running tier-1 work
    # pauses the compile pools (a FIFO knows no tier 1).
    boosts_for_tier1 = True
    pauses_pools_for_tier1 = True

    def __init__(
        self,
        config: TierConfig | None = None,
        options: ExecutorOptions | None = None,
        pools: Sequence[PoolControl | None] = (),
        gates: Sequence[WorkGate] = (),
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        start: bool = True,
    ) -> None:
        self.config = config or TierConfig()
        self.options = options or ExecutorOptions()
        self._pools = [p for p in pools if p is not None] if self.pauses_pools_for_tier1 else []
        # Held while any unit is queued or runs: the compile gates of the engines it serves.
        self._gates = list(gates)
        self._holding = False
        self._clock = clock
        self._wall = wall_clock
        lock = threading.RLock()
        self._cv = threading.Condition(lock)
        # Reserved lanes wait apart: they run tier 1 only, and each wake-up of a real-time
        # lane for other work took the GIL from the lane that had that work.
        self._tier1_cv = threading.Condition(lock)
        self._seq = itertools.count()
        self._closed = False
        self._running = 0
        self._stats = {t: TierStats(self.options.latency_window) for t in TIERS}
        self._transport: dict[str, Window] = {}
        self._cost_ms: dict[CostKey, float] = {}
        self._threads: list[threading.Thread] = []
        self._saved_switch: float | None = None
        self._saved_blas: int | None = None
        self._saved_opencv: int | None = None
        self._rt_lanes = 0
        self._shared_tids: list[int] = []
        self._tier1_active = 0
        # Reserved lanes waiting for work: a shared lane leaves tier 1 to them.
        self._idle_reserved = 0
        self._boosted = False
        self._boosts = 0
        self._boost_ok = True
        self._init_queue()
        if start:
            if self.options.switch_interval_ms is not None:
                self._saved_switch = sys.getswitchinterval()
                sys.setswitchinterval(self.options.switch_interval_ms / 1000.0)
            if self.options.blas_threads is not None:
                self._saved_blas = set_blas_threads(self.options.blas_threads)
                if self._saved_blas is None:
                    log.warning("no OpenBLAS whose threads can be set: BLAS keeps its threads")
            if self.options.opencv_threads is not None:
                self._saved_opencv = set_opencv_threads(self.options.opencv_threads)
            keep = self.options.allocator_keep_mb
            if keep is not None and not keep_freed_memory(keep):
                log.warning("allocator settings refused: the C library is not glibc")
            for i, lane in enumerate(self._lanes()):
                thread = threading.Thread(
                    target=self._serve, args=(lane,), name=f"{self.kind}-{lane}-{i}", daemon=True
                )
                self._threads.append(thread)
                thread.start()

    # -- policy hooks ----------------------------------------------------------------
    def _init_queue(self) -> None:
        """Set up the policy's queue; runs before any lane starts."""
        raise NotImplementedError

    def _lanes(self) -> list[Lane]:
        raise NotImplementedError

    def _admit_locked(self, work: Work, now: float) -> tuple[str | None, list[Work]]:
        """Queue ``work`` or refuse it (a drop reason); also returns units it displaced."""
        raise NotImplementedError

    def _pop_locked(self, lane: Lane, now: float) -> tuple[Work | None, list[tuple[Work, str]]]:
        raise NotImplementedError

    def _requeue_locked(self, work: Work, now: float) -> str | None:
        raise NotImplementedError

    def _drain_queue_locked(self) -> list[Work]:
        raise NotImplementedError

    def _queued_locked(self) -> list[Work]:
        raise NotImplementedError

    def _chunked(self) -> bool:
        return True

    # -- public interface ------------------------------------------------------------
    def arrive(self, topic: str, stamp_s: float | None = None) -> Arrival:
        """Note a frame's arrival now; its transport latency is wall clock minus its stamp."""
        now = self._clock()
        transport = None if stamp_s is None else (self._wall() - stamp_s) * 1000.0
        with self._cv:
            if transport is not None:
                window = self._transport.get(topic)
                if window is None:
                    window = self._transport[topic] = Window(self.options.latency_window)
                window.append(transport)
        return Arrival(topic, now, stamp_s, transport)

    def submit(
        self,
        fn: JobFn,
        tier: int | Tier,
        *,
        arrival: Arrival | None = None,
        name: str = "work",
        stream: str | None = None,
        speculative: bool = False,
        est_ms: float | None = None,
        size: int | None = None,
    ) -> Future[Any]:
        """Queue ``fn`` at ``tier``; its deadline is the arrival plus the tier's deadline.

        With an ``arrival`` on a topic, the stream defaults to ``topic/name``: a newer unit of
        the same stream replaces a queued older one (the newest frame wins). ``size`` (points,
        agents) keys the cost estimate: work of one name costs what its input size costs.
        """
        tier = as_tier(tier)
        size_bucket(size)
        # A NaN estimate would turn the work-ahead sums NaN and switch off shedding for all.
        if est_ms is not None and not (np.isfinite(est_ms) and est_ms >= 0.0):
            raise ConfigError(f"est_ms must be a finite number >= 0, got {est_ms!r}")
        if arrival is not None and not np.isfinite(arrival.arrival_s):
            raise ConfigError(f"arrival time must be finite, got {arrival.arrival_s!r}")
        now = self._clock()
        arrival = arrival or Arrival("", now)
        if stream is None and arrival.topic:
            stream = f"{arrival.topic}/{name}"
        future: Future[Any] = Future()
        with self._cv:
            if self._closed:
                raise SchedulingError(f"executor is shut down; cannot submit {name!r}")
            work = Work(
                fn=fn,
                tier=tier,
                name=name,
                arrival=arrival,
                deadline_s=arrival.arrival_s + self.config.deadline_s(tier),
                seq=next(self._seq),
                stream=stream,
                speculative=speculative,
                est_ms=est_ms,
                future=future,
                size=size,
            )
            self._stats[tier].submitted += 1
            refused, displaced = self._admit_locked(work, now)
            if refused is None and tier == Tier.COLLISION and self.boosts_for_tier1:
                work.active = True
                self._tier1_active += 1
            dropped = [(w, "stale") for w in displaced]
            if refused is not None:
                dropped.append((work, refused))
            for item, reason in dropped:
                self._count_drop_locked(item, reason, now)
            self._apply_boost_locked()
            self._gate_locked()
            self._wake_locked(tier == Tier.COLLISION)
        self._finish_drops(dropped)
        return future

    def update_config(self, config: TierConfig) -> None:
        """Swap the tunable settings; queued units keep the deadlines they were given."""
        with self._cv:
            self.config = config
            self._cv.notify_all()

    def set_estimate(self, name: str, ms: float, size: int | None = None) -> None:
        """Seed the service-time estimate of work called ``name`` (e.g. from a calibration),
        for units of about ``size`` (its size bucket) or, without a size, for any size."""
        if not (np.isfinite(ms) and ms >= 0.0):
            raise ConfigError(f"an estimate must be a finite number >= 0 ms, got {ms!r}")
        with self._cv:
            self._cost_ms[(name, size_bucket(size))] = float(ms)

    def estimate_ms(self, name: str, size: int | None = None) -> float:
        """The smoothed measured service time of work called ``name`` of about ``size``;
        the estimate of any size of that name when its bucket has none yet (0 before any)."""
        with self._cv:
            return self._cost_locked(name, size_bucket(size))

    def _cost_locked(self, name: str, bucket: int | None) -> float:
        cost = self._cost_ms.get((name, bucket))
        return cost if cost is not None else self._cost_ms.get((name, None), 0.0)

    @property
    def degraded(self) -> bool:
        return False

    def far_field_keep_fraction(self) -> float:
        """Share of far-field points producers should keep now (1.0 unless degraded)."""
        return 1.0

    def run_one(self, lane: Lane = "shared") -> bool:
        """Run the next unit (one chunk) for ``lane`` on the calling thread; False if none.

        For simulation and deterministic tests of an executor built with ``start=False``.
        """
        with self._cv:
            work, shed = self._pop_locked(lane, self._clock())
            for item, reason in shed:
                self._count_drop_locked(item, reason, self._clock())
            if work is not None:
                self._running += 1
            self._gate_locked()
        self._finish_drops(shed)
        if work is None:
            return False
        self._execute(work)
        return True

    def drain(self, timeout_s: float) -> bool:
        """Wait until nothing is queued or running; False on timeout."""
        with self._cv:
            return self._cv.wait_for(
                lambda: not (self._queued_locked() or self._running), timeout_s
            )

    def close(self, timeout_s: float = 5.0) -> None:
        """Stop accepting work, drop what is queued (counted), and join the workers."""
        with self._cv:
            if self._closed:
                return
            self._closed = True
            dropped = [(w, "shutdown") for w in self._drain_queue_locked()]
            for work, reason in dropped:
                self._count_drop_locked(work, reason, self._clock())
            self._apply_boost_locked()
            self._wake_locked(True)
            self._gate_locked()
        self._finish_drops(dropped)
        end = time.monotonic() + timeout_s
        for thread in self._threads:
            thread.join(max(0.0, end - time.monotonic()))
        alive = [t.name for t in self._threads if t.is_alive()]
        if self._saved_switch is not None:
            sys.setswitchinterval(self._saved_switch)
            self._saved_switch = None
        if self._saved_blas is not None:
            set_blas_threads(self._saved_blas)
            self._saved_blas = None
        if self._saved_opencv is not None:
            set_opencv_threads(self._saved_opencv)
            self._saved_opencv = None
        if alive:
            log.warning("executor workers still running a unit after %.1f s: %s", timeout_s, alive)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def snapshot(self) -> dict[str, Any]:
        """Per-tier counts and latencies, drop reasons, transport latency: for diagnostics."""
        # Copy under the lock, compute outside: a lane must never wait on percentiles.
        with self._cv:
            queued = Counter(int(w.tier) for w in self._queued_locked())
            copies = {
                tier: (
                    st.submitted,
                    st.completed,
                    st.misses,
                    st.failed,
                    Counter(st.dropped),
                    st.latency_ms.copy(),
                    st.wait_ms.copy(),
                    st.starvations,
                    self._starved_locked(tier),
                )
                for tier, st in self._stats.items()
            }
            transport_copy = {t: v.copy() for t, v in self._transport.items() if len(v)}
            head = {
                "executor": self.kind,
                "running": self._running,
                "realtime_lanes": self._rt_lanes,
                "shared_boosts": self._boosts,
                "blas_threads": self.options.blas_threads if self._saved_blas else None,
                "opencv_threads": (
                    self.options.opencv_threads if self._saved_opencv is not None else None
                ),
            }
            extra = self._extra_snapshot_locked()
            deadlines = {tier: self.config.deadline_ms(tier) for tier in TIERS}
        tiers: dict[str, Any] = {}
        for tier, (
            submitted,
            completed,
            misses,
            failed,
            dropped,
            lat,
            wait,
            starvations,
            starved,
        ) in copies.items():
            p50, p99 = percentiles_or_none(lat, (50, 99))
            tiers[str(int(tier))] = {
                "name": tier.name.lower(),
                "deadline_ms": deadlines[tier],
                "submitted": submitted,
                "completed": completed,
                "misses": misses,
                "failed": failed,
                "dropped": sum(dropped.values()),
                "dropped_by": {r: dropped.get(r, 0) for r in DROP_REASONS},
                "queued": queued.get(int(tier), 0),
                "starvations": starvations,
                "starved": starved,
                "p50_ms": p50,
                "p99_ms": p99,
                "max_ms": round(float(lat.max()), 3) if lat.size else None,
                "wait_p99_ms": percentile_or_none(wait, 99),
            }
        transport = {
            topic: {
                "count": int(v.size),
                "mean_ms": round(float(v.mean()), 3),
                "p99_ms": percentile_or_none(v, 99),
                "max_ms": round(float(v.max()), 3),
            }
            for topic, v in transport_copy.items()
        }
        return {**head, "tiers": tiers, "transport": transport, **extra}

    def _extra_snapshot_locked(self) -> dict[str, Any]:
        return {}

    # -- workers -----------------------------------------------------------------------
    def _serve(self, lane: Lane) -> None:
        self._set_priority(lane)
        while True:
            with self._cv:
                while True:
                    work, shed = self._pop_locked(lane, self._clock())
                    for item, reason in shed:
                        self._count_drop_locked(item, reason, self._clock())
                    if work is not None or shed or self._closed:
                        break
                    self._wait_locked(lane)
                if work is not None:
                    self._running += 1
                self._gate_locked()
                if work is None and self._closed:
                    return
            self._finish_drops(shed)
            if work is not None:
                self._execute(work)

    def _wait_locked(self, lane: Lane) -> None:
        if lane != "reserved":
            self._cv.wait()
            return
        self._idle_reserved += 1
        try:
            self._tier1_cv.wait()
        finally:
            self._idle_reserved -= 1

    def _wake_locked(self, tier1: bool) -> None:
        """Wake the shared lanes (and drain), and the reserved ones if tier-1 work came."""
        self._cv.notify_all()
        if tier1:
            self._tier1_cv.notify_all()

    def _set_priority(self, lane: Lane) -> None:
        tid = threading.get_native_id()
        rt = self.options.reserved_rt_priority
        if lane == "reserved" and rt is not None:
            try:
                os.sched_setscheduler(tid, os.SCHED_FIFO, os.sched_param(rt))
            except (OSError, AttributeError) as err:
                log.warning("reserved lane keeps normal scheduling (SCHED_FIFO refused): %s", err)
            else:
                with self._cv:
                    self._rt_lanes += 1
        if lane == "shared":
            with self._cv:
                self._shared_tids.append(tid)
        if lane == "shared" and self.options.shared_nice is not None:
            try:
                os.setpriority(os.PRIO_PROCESS, tid, self.options.shared_nice)
            except OSError as err:
                log.warning("shared lane keeps its nice value: %s", err)

    def _execute(self, work: Work) -> None:
        """Run one chunk (tiered) or the whole unit (FIFO), then account for it."""
        started = self._clock()
        if work.started_s is None:
            work.started_s = started
            if not work.future.set_running_or_notify_cancel():
                with self._cv:
                    self._count_drop_locked(work, "cancelled", started)
                    self._running -= 1
                    self._gate_locked()
                    self._cv.notify_all()
                return
        pause = work.tier == Tier.COLLISION and bool(self._pools)
        if pause:
            for pool in self._pools:
                pool.pause()
        try:
            done, result, error = self._step(work)
            while not done and not self._chunked():
                done, result, error = self._step(work)
        finally:
            if pause:
                for pool in self._pools:
                    pool.resume()
        finished = self._clock()
        work.service_ms += (finished - started) * 1000.0
        drop: str | None = None
        with self._cv:
            if done:
                self._complete_locked(work, finished, error)
            else:
                drop = self._requeue_locked(work, finished)
                if drop is not None:
                    self._count_drop_locked(work, drop, finished)
        if done:
            if error is not None:
                work.future.set_exception(error)
            else:
                work.future.set_result(result)
        elif drop is not None:
            self._finish_drops([(work, drop)])
        with self._cv:
            self._running -= 1
            self._gate_locked()
            self._cv.notify_all()

    @staticmethod
    def _step(work: Work) -> tuple[bool, Any, BaseException | None]:
        try:
            gen = work.gen
            if gen is None:
                out = work.fn()
                if not inspect.isgenerator(out):
                    return True, out, None
                gen = work.gen = cast(Generator[Any, None, Any], out)
            next(gen)
            work.chunks += 1
            return False, None, None
        except StopIteration as stop:
            return True, stop.value, None
        # BaseException too (a stage calling sys.exit): uncaught, it would end the lane with
        # the unit's future unresolved and the running count never released.
        except BaseException as err:  # noqa: BLE001 - a failing unit fails its future, not the lane
            return True, None, err

    # -- accounting ----------------------------------------------------------------------
    def _gate_locked(self) -> None:
        """Hold the gates while any unit is queued or runs; let go once none is left.

        Under the lock, so that an enter and a leave never swap places on their way out.
        """
        busy = self._running > 0 or any(True for _ in self._queued_locked())
        if busy == self._holding:
            return
        self._holding = busy
        for gate in self._gates:
            if busy:
                gate.enter()
            else:
                gate.leave()

    def _leave_locked(self, work: Work) -> None:
        if work.active:
            work.active = False
            self._tier1_active -= 1
            self._apply_boost_locked()

    def _apply_boost_locked(self) -> None:
        """Boost shared lanes while tier-1 work is queued or running; unboost after."""
        priority = self.options.shared_boost_rt_priority
        want = self._tier1_active > 0 and self._boost_ok and not self._closed
        if priority is None or want == self._boosted or not self._shared_tids:
            return
        policy, param = (os.SCHED_FIFO, priority) if want else (os.SCHED_OTHER, 0)
        try:
            for tid in self._shared_tids:
                os.sched_setscheduler(tid, policy, os.sched_param(param))
        except (OSError, AttributeError) as err:
            log.warning("shared lanes keep normal scheduling (boost refused): %s", err)
            self._boost_ok = False
            if not want:
                return
            want = False
        self._boosted = want
        self._boosts += int(want)

    def _complete_locked(self, work: Work, finished: float, error: BaseException | None) -> None:
        self._leave_locked(work)
        st = self._stats[work.tier]
        work.state = "done"
        if error is not None:
            st.failed += 1
            log.warning("%s (tier %d) failed: %s", work.name, int(work.tier), error)
            return
        st.completed += 1
        st.unserved = 0
        latency = (finished - work.arrival.arrival_s) * 1000.0
        st.latency_ms.append(latency)
        st.wait_ms.append(((work.started_s or finished) - work.arrival.arrival_s) * 1000.0)
        if finished > work.deadline_s:
            st.misses += 1
            self._on_trouble_locked(work.tier, finished)
        # The unit's size bucket, and the name over any size (the fallback of a new bucket).
        keys = {(work.name, size_bucket(work.size)), (work.name, None)}
        for key in keys:
            old = self._cost_ms.get(key)
            self._cost_ms[key] = (
                work.service_ms if old is None else old + COST_SMOOTHING * (work.service_ms - old)
            )

    def _count_drop_locked(self, work: Work, reason: str, now: float) -> None:
        self._leave_locked(work)
        work.state = "dropped"
        st = self._stats[work.tier]
        st.dropped[reason] += 1
        if reason in TROUBLE:
            st.unserved += 1
            if st.unserved == self.config.starvation_frames:
                st.starvations += 1
                log.error(
                    "tier %d (%s) starved: %d unit(s) refused or expired since it last "
                    "completed one; its newest is admitted",
                    int(work.tier),
                    work.tier.name.lower(),
                    st.unserved,
                )
            self._on_trouble_locked(work.tier, now)

    def _starved_locked(self, tier: Tier) -> bool:
        """Whether the tier's newest unit is to run whatever its estimate says."""
        return self._stats[tier].unserved >= self.config.starvation_frames

    def _decay_locked(self, work: Work) -> None:
        """A unit refused on its own estimate never runs to correct it: the estimate of its
        name and size decays instead, so that a stale high one cannot lock the stream out."""
        if work.est_ms is not None:
            return
        key = (work.name, size_bucket(work.size))
        self._cost_ms[key] = self._cost_locked(*key) * (1.0 - COST_SMOOTHING)

    def _on_trouble_locked(self, tier: Tier, now: float) -> None:
        """Hook: a shed or a miss happened (the tiered executor enters degraded mode)."""

    @staticmethod
    def _finish_drops(dropped: Iterable[tuple[Work, str]]) -> None:
        """Outside the lock: fail futures with CancelledError (callbacks run here)."""
        for work, reason in dropped:
            if work.gen is not None:
                try:
                    work.gen.close()
                except Exception as err:  # noqa: BLE001 - cleanup of a dropped unit must not stop a lane
                    log.warning("closing dropped %s failed: %s", work.name, err)
            future = work.future
            if future.running() or future.set_running_or_notify_cancel():
                future.set_exception(CancelledError(f"{work.name} dropped: {reason}"))

    def _est_locked(self, work: Work) -> float:
        if work.est_ms is not None:
            return work.est_ms
        return self._cost_locked(work.name, size_bucket(work.size))
