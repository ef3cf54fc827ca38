"""Runtime metrics in one thread-safe object that diagnostics and benchmarks read."""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from dynshape_perception.runtime.shapes import Signature

EMA_WEIGHT = 0.2
EVENTS_KEPT = 4096

LatencyRows = Callable[[], Iterable[tuple[Signature, "LatencyStats"]]]


def ewma(mean: float | None, value: float) -> float:
    """The running mean every latency figure here keeps; ``None`` starts it at ``value``."""
    return value if mean is None else mean + EMA_WEIGHT * (value - mean)


class LatencyStats:
    """One signature's calls and latency."""

    __slots__ = ("calls", "max_ms", "mean_ms")

    def __init__(self) -> None:
        self.calls = 0
        self.mean_ms = 0.0
        self.max_ms = 0.0

    def add(self, ms: float) -> None:
        self.calls += 1
        self.mean_ms = ewma(self.mean_ms if self.calls > 1 else None, ms)
        self.max_ms = max(self.max_ms, ms)


class CallTally:
    """One dispatcher's call counts and busy time, updated under the lock its calls already
    hold: a call after a point cloud finds each extra lock and object cold."""

    __slots__ = ("busy_s", "calls", "generic_calls", "hits", "misses")

    def __init__(self) -> None:
        self.calls = self.hits = self.misses = self.generic_calls = 0
        self.busy_s = 0.0

    def add(self, row: LatencyStats, ms: float, hit: bool, accepted: bool) -> None:
        """Count one call and add its latency to its signature's row."""
        self.calls += 1
        self.busy_s += ms * 0.001
        if hit:
            self.hits += 1
        else:
            self.generic_calls += 1
            if accepted:
                self.misses += 1
        row.add(ms)

    @property
    def hit_rate(self) -> float:
        """Hits over the calls of accepted keys, hit or missed."""
        accepted = self.hits + self.misses
        return self.hits / accepted if accepted else 0.0


@dataclass
class CompileEvent:
    t_s: float
    model: str
    key: str
    ok: bool
    compile_s: float
    reason: str = ""
    # Built but slower than generic: counted in compiles_rejected. A build loaded from the
    # artefact cache is ok, with its reason saying so.
    rejected: bool = False


@dataclass
class JitMetrics:
    compiles_ok: int = 0
    compiles_failed: int = 0
    compiles_rejected: int = 0
    compile_time_s: float = 0.0
    evictions: int = 0
    # Artefact-cache entries evicted from disk to keep its bound (jit.disk_max_bytes).
    disk_evictions: int = 0
    demoted: int = 0
    blacklisted: int = 0
    degraded_episodes: int = 0
    latency_signatures_dropped: int = 0
    # Warm-up profile entries that name no function, other dims, or shapes past the bounds.
    shape_log_entries_skipped: int = 0
    # The newest compile events; a node runs for days, and LRU churn recompiles.
    events: deque[CompileEvent] = field(default_factory=lambda: deque(maxlen=EVENTS_KEPT))
    events_recorded: int = 0
    # Per model, its dispatcher's latency rows and call tally: each dispatcher owns, bounds and
    # updates its own, so a call touches nothing shared; reads here sum them.
    _latency_sources: dict[str, LatencyRows] = field(default_factory=dict, repr=False)
    _tallies: dict[str, CallTally] = field(default_factory=dict, repr=False)
    # Per model, what brings its tally up to date: dispatchers settle calls off the calling
    # path, and a read must see every call made before it.
    _settlers: dict[str, Callable[[], None]] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    # Per model, whether its dispatcher has stopped specialising: one model's recovery must
    # not hide another's degrade.
    _degraded: dict[str, bool] = field(default_factory=dict, repr=False)

    @property
    def degraded(self) -> bool:
        # A copy taken in one step, as a dispatcher may add its model meanwhile.
        return any(tuple(self._degraded.values()))

    def set_degraded(self, model: str, degraded: bool) -> None:
        with self._lock:
            self._degraded[model] = degraded

    def add_source(
        self,
        model: str,
        rows: LatencyRows,
        tally: CallTally,
        settle: Callable[[], None] | None = None,
    ) -> None:
        with self._lock:
            self._latency_sources[model] = rows
            self._tallies[model] = tally
            if settle is not None:
                self._settlers[model] = settle

    def settle(self) -> None:
        """Bring every tally up to date with the calls made so far."""
        with self._lock:
            settlers = list(self._settlers.values())
        for settle in settlers:
            settle()

    def totals(self, settle: bool = True) -> CallTally:
        """Every dispatcher's tally summed into one; unsettled, without the calls whose records
        are still queued (for readers on the bookkeeping path itself)."""
        if settle:
            self.settle()
        with self._lock:
            tallies = list(self._tallies.values())
        total = CallTally()
        for name in CallTally.__slots__:
            setattr(total, name, sum(getattr(t, name) for t in tallies))
        return total

    @property
    def calls(self) -> int:
        return self.totals().calls

    @property
    def hits(self) -> int:
        return self.totals().hits

    @property
    def misses(self) -> int:
        return self.totals().misses

    @property
    def generic_calls(self) -> int:
        return self.totals().generic_calls

    @property
    def busy_s(self) -> float:
        """Seconds the calling path spent in calls, specialised or generic."""
        return self.totals().busy_s

    def record_compile(self, event: CompileEvent, rejected: bool = False) -> None:
        event.rejected = event.rejected or rejected
        with self._lock:
            self._append_event(event)
            self.compile_time_s += event.compile_s
            if event.rejected:
                self.compiles_rejected += 1
            elif event.ok:
                self.compiles_ok += 1
            else:
                self.compiles_failed += 1

    def record_event(self, event: CompileEvent) -> None:
        """An event that is not a compile (a demotion): kept in the log, counted nowhere."""
        with self._lock:
            self._append_event(event)

    def _append_event(self, event: CompileEvent) -> None:
        self.events.append(event)
        self.events_recorded += 1

    def events_since(self, seen: int) -> tuple[list[CompileEvent], int]:
        """The events recorded after the first ``seen`` that are still kept, and how many
        have been recorded in all (the next call's ``seen``)."""
        with self._lock:
            total = self.events_recorded
            kept = list(self.events)
        return kept[max(0, seen - (total - len(kept))) :], total

    def bump(self, name: str, by: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + by)

    @property
    def hit_rate(self) -> float:
        return self.totals().hit_rate

    def snapshot(self) -> dict[str, Any]:
        return self.record()[0]

    def record(self) -> tuple[dict[str, Any], list[CompileEvent]]:
        """The counters and the kept events, read in one step: a compile that lands between two
        reads would count in one and not the other."""
        total = self.totals()
        with self._lock:
            counters = {
                "calls": total.calls,
                "hits": total.hits,
                "misses": total.misses,
                "generic_calls": total.generic_calls,
                "hit_rate": round(total.hit_rate, 4),
                "compiles_ok": self.compiles_ok,
                "compiles_failed": self.compiles_failed,
                "compiles_rejected": self.compiles_rejected,
                "compile_time_s": round(self.compile_time_s, 3),
                "evictions": self.evictions,
                "disk_evictions": self.disk_evictions,
                "demoted": self.demoted,
                "blacklisted": self.blacklisted,
                "degraded": self.degraded,
                "degraded_episodes": self.degraded_episodes,
                "latency_signatures_dropped": self.latency_signatures_dropped,
                "shape_log_entries_skipped": self.shape_log_entries_skipped,
            }
            return counters, list(self.events)

    def latency_table(self) -> dict[str, dict[str, dict[str, float]]]:
        with self._lock:
            sources = dict(self._latency_sources)
        # Rows are listed outside this lock: a source takes its owner's lock to list them.
        listed = {model: list(rows()) for model, rows in sources.items()}
        with self._lock:
            return {
                model: {
                    str(sig): {
                        "calls": s.calls,
                        "mean_ms": round(s.mean_ms, 4),
                        "max_ms": round(s.max_ms, 4),
                    }
                    for sig, s in rows
                    if s.calls
                }
                for model, rows in listed.items()
            }
