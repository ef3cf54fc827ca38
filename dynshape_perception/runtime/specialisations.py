"""What the dispatcher keeps per specialisation and per signature, and the bounded cache."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dynshape_perception.compiler.cache import SIDECAR, Sidecar, file_sha256
from dynshape_perception.errors import ValidationError
from dynshape_perception.runtime.executable import LoadedModel
from dynshape_perception.runtime.metrics import (
    JitMetrics,
    LatencyStats,
)
from dynshape_perception.runtime.shapes import (
    Padding,
    Signature,
)


@dataclass(slots=True)
class Specialisation:
    key: Signature
    model: LoadedModel
    nbytes: int
    speedup: float
    # Served calls and their summed latency, to judge it in place (see Dispatcher._judge).
    hits: int = 0
    hit_ms: float = 0.0
    judged: bool = False
    # When it last served (perf_counter): the cache evicts the least recent.
    last_used: float = 0.0
    # False once evicted or demoted: a caller holding it through its key state serves generic.
    live: bool = True


@dataclass(slots=True)
class KeyState:
    """What the policy knows about one specialisation key (slotted: read on every call)."""

    calls: int = 0
    first_seen_s: float = 0.0
    last_seen_s: float = 0.0
    generic_ms: float = 0.0
    # Generic latency while no compile runs: the baseline that interference is measured by.
    idle_ms: float = 0.0
    # The fastest generic call: the key's latency with warm caches, as a worker times it.
    fastest_ms: float = 0.0
    strikes: int = 0
    blacklisted: bool = False
    rejected: bool = False
    accepted: bool = False
    sample: list[np.ndarray] | None = None
    # Generic-served calls counted on the calling thread, ahead of ``calls``, which is
    # settled later: the call that makes the key hot copies its inputs as the compile sample.
    arrivals: int = 0
    # Accepted later than that call, with no sample: the next call copies its inputs.
    want_sample: bool = False
    # The specialisation serving this key while it is cached.
    entry: Specialisation | None = None


class ShapeRecord:
    """One signature's share of the bookkeeping, reached by one dict lookup per call.

    Calls arrive milliseconds apart, after a point cloud has flushed the caches. A call that
    reads one record, its key's state and its latency row pays for a few cache lines; one that
    walks a profile counter, a key table and a latency table pays for each of them.
    """

    __slots__ = ("admitted", "key", "latency", "padding", "sig", "state")

    def __init__(self, sig: Signature, key: Signature, admitted: bool, state: KeyState) -> None:
        self.sig = sig
        self.key = key
        self.admitted = admitted
        self.state = state
        # Its calls are the signature's profile count.
        self.latency = LatencyStats()
        # From its dims to its key's, planned at its first hit.
        self.padding: Padding | None = None


class SpecialisationCache:
    """LRU bounded by entry count and by library bytes, counting evictions.

    A hit reaches its entry through its key's state and stamps ``last_used``, without this
    lock: recency is read only when a put has to evict, off the calling path.
    """

    def __init__(
        self,
        max_entries: int,
        max_bytes: int,
        metrics: JitMetrics,
        on_remove: Callable[[Specialisation], None] = lambda entry: None,
    ) -> None:
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._metrics = metrics
        # Told of every entry leaving, so that nothing else keeps its library loaded.
        self._on_remove = on_remove
        self._entries: dict[Signature, Specialisation] = {}
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, entry: Specialisation) -> None:
        with self._lock:
            self._remove_locked(entry.key)
            entry.last_used = time.perf_counter()
            self._entries[entry.key] = entry
            self._bytes += entry.nbytes
            self._evict_locked()

    def resize(self, max_entries: int, max_bytes: int) -> None:
        """New bounds, enforced now: waiting for the next put could keep every library
        loaded for good once the workload settles, or in frozen mode."""
        with self._lock:
            self.max_entries = max_entries
            self.max_bytes = max_bytes
            self._evict_locked()

    def _evict_locked(self) -> None:
        while len(self._entries) > self.max_entries or (
            self._bytes > self.max_bytes and len(self._entries) > 1
        ):
            oldest = min(self._entries.values(), key=lambda e: e.last_used)
            self._remove_locked(oldest.key)
            self._metrics.bump("evictions")

    def drop(self, key: Signature) -> None:
        with self._lock:
            self._remove_locked(key)

    def _remove_locked(self, key: Signature) -> None:
        old = self._entries.pop(key, None)
        if old is not None:
            old.live = False
            self._bytes -= old.nbytes
            self._on_remove(old)

    def keys(self) -> list[Signature]:
        """Least recently used first."""
        with self._lock:
            return [e.key for e in sorted(self._entries.values(), key=lambda e: e.last_used)]

    @property
    def nbytes(self) -> int:
        return self._bytes

    def __len__(self) -> int:
        return len(self._entries)


def check_sidecar(library: Path, model: str, key: Signature) -> None:
    """The library beside this sidecar is the specialisation of ``key``, and nothing else,
    and it is the very file the worker validated: loading a truncated one would crash the
    serving process (SIGBUS), where a refusal is only a strike."""
    side = Sidecar.from_json((library.parent / SIDECAR).read_text())
    if side.model != model or side.pinned_dims != key.as_dict():
        raise ValidationError(f"{library} holds {side.model} {side.pinned_dims}, not {key}")
    if side.functions != [key.function]:
        raise ValidationError(f"{library} holds functions {side.functions}, not {key.function}")
    if file_sha256(library) != side.library_sha256:
        raise ValidationError(f"{library} does not match its recorded checksum")
