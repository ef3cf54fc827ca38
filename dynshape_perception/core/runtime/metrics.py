"""Runtime metrics in one thread-safe object that diagnostics and benchmarks read."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from dynshape_perception.core.runtime.shapes import Signature

EMA_WEIGHT = 0.2

LatencyRows = Callable[[], Iterable[tuple[Signature, "LatencyStats"]]]


def ewma(mean: float | None, value: float) -> float:
    """The running mean every latency figure here keeps; ``None`` starts it at ``value``."""
    return value if mean is None else mean + EMA_WEIGHT * (value - mean)


@dataclass
class LatencyStats:
    calls: int = 0
    mean_ms: float = 0.0
    max_ms: float = 0.0

    def add(self, ms: float) -> None:
        self.calls += 1
        self.mean_ms = ewma(self.mean_ms if self.calls > 1 else None, ms)
        self.max_ms = max(self.max_ms, ms)


@dataclass
class CompileEvent:
    t_s: float
    model: str
    key: str
    ok: bool
    compile_s: float
    reason: str = ""


@dataclass
class JitMetrics:
    calls: int = 0
    hits: int = 0
    misses: int = 0
    generic_calls: int = 0
    compiles_ok: int = 0
    compiles_failed: int = 0
    compiles_rejected: int = 0
    compile_time_s: float = 0.0
    evictions: int = 0
    demoted: int = 0
    blacklisted: int = 0
    degraded_episodes: int = 0
    degraded: bool = False
    latency_signatures_dropped: int = 0
    events: list[CompileEvent] = field(default_factory=list)
    # Per model, its signatures' latency rows: each dispatcher owns and bounds its own, so a
    # call updates the row it already holds instead of looking one up here.
    _latency_sources: dict[str, LatencyRows] = field(default_factory=dict, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def record_call(self, row: LatencyStats, ms: float, hit: bool, accepted: bool) -> None:
        """Count one call and add its latency to its signature's row."""
        with self._lock:
            self.calls += 1
            if hit:
                self.hits += 1
            else:
                self.generic_calls += 1
                if accepted:
                    self.misses += 1
            row.add(ms)

    def add_latency_source(self, model: str, rows: LatencyRows) -> None:
        with self._lock:
            self._latency_sources[model] = rows

    def record_compile(self, event: CompileEvent, rejected: bool = False) -> None:
        with self._lock:
            self.events.append(event)
            self.compile_time_s += event.compile_s
            if rejected:
                self.compiles_rejected += 1
            elif event.ok:
                self.compiles_ok += 1
            else:
                self.compiles_failed += 1

    def record_event(self, event: CompileEvent) -> None:
        """An event that is not a compile (a demotion): kept in the log, counted nowhere."""
        with self._lock:
            self.events.append(event)

    def bump(self, name: str, by: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + by)

    @property
    def hit_rate(self) -> float:
        accepted = self.hits + self.misses
        return self.hits / accepted if accepted else 0.0

    def snapshot(self) -> dict[str, Any]:
        with self._lock:
            return {
                "calls": self.calls,
                "hits": self.hits,
                "misses": self.misses,
                "generic_calls": self.generic_calls,
                "hit_rate": round(self.hit_rate, 4),
                "compiles_ok": self.compiles_ok,
                "compiles_failed": self.compiles_failed,
                "compiles_rejected": self.compiles_rejected,
                "compile_time_s": round(self.compile_time_s, 3),
                "evictions": self.evictions,
                "demoted": self.demoted,
                "blacklisted": self.blacklisted,
                "degraded": self.degraded,
                "degraded_episodes": self.degraded_episodes,
                "latency_signatures_dropped": self.latency_signatures_dropped,
            }

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
