"""Dropped-input counters with one throttled warning per reason, and say-once notices."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable


class DropCounter:
    """Counts drops per reason; warns at most once per ``throttle_s`` for each reason.

    Thread-safe: the subscription thread and the executor's lanes both count drops.
    """

    def __init__(
        self,
        reasons: Iterable[str],
        warn: Callable[[str], object],
        throttle_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.counts: dict[str, int] = dict.fromkeys(reasons, 0)
        self.throttle_s = throttle_s
        self._warn = warn
        self._clock = clock
        self._last_warned: dict[str, float] = {}
        self._said: set[str] = set()
        self._lock = threading.Lock()

    @property
    def total(self) -> int:
        with self._lock:
            return sum(self.counts.values())

    def snapshot(self) -> dict[str, int]:
        with self._lock:
            return dict(self.counts)

    def drop(self, reason: str, detail: str) -> None:
        with self._lock:
            count = self.counts[reason] = self.counts.get(reason, 0) + 1
            now = self._clock()
            last = self._last_warned.get(reason)
            warn = last is None or now - last >= self.throttle_s
            if warn:
                self._last_warned[reason] = now
        if warn:
            self._warn(f"dropped input ({reason}, {count} so far): {detail}")

    def once(self, key: str, message: str) -> bool:
        """Warn with ``message`` the first time ``key`` comes up; True that time."""
        with self._lock:
            if key in self._said:
                return False
            self._said.add(key)
        self._warn(message)
        return True
