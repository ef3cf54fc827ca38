"""Settles the dispatchers' call records on a thread of their own, off the calling path."""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable

log = logging.getLogger(__name__)

Settle = Callable[[], None]
# How often the thread settles what the calls queued, unless rung sooner. Waking it on every
# call would cost the caller a futex wake, as much as the work it moves away; and each wake
# costs this thread some CPU, which a call it overlaps loses, since the two share the cores.
# Busy callers ring it every few dozen calls (dispatcher.RING_AT): the poll only bounds how
# long the records of a few slow calls wait.
POLL_S = 0.1


class Bookkeeper:
    """One daemon thread per engine that settles its dispatchers' queued call records.

    A call arrives after a point cloud has flushed the caches, and every object the profile,
    the cost model and the interference meter touch is then a miss: tens of microseconds on
    a call of fifty. The calling thread only queues what it measured; this thread does the
    rest every ``poll_s``, or sooner when rung, at the end of a call, mostly in the idle time
    before the next one.
    """

    def __init__(self, poll_s: float = POLL_S, name: str = "jit-bookkeeper") -> None:
        self.poll_s = poll_s
        self._settlers: list[Settle] = []
        self._lock = threading.Lock()
        self._bell: queue.SimpleQueue[bool] = queue.SimpleQueue()
        self._closed = False
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    def add(self, settle: Settle) -> None:
        with self._lock:
            self._settlers.append(settle)

    def ring(self, settle: Settle) -> None:
        """Settle soon rather than at the next poll (a caller's queue is long).

        Once closed there is no thread to ask, so the caller settles its own calls.
        """
        if self._closed:
            settle()
            return
        self._bell.put(True)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self, timeout_s: float = 5.0) -> None:
        if self._closed:
            return
        self._closed = True
        self._bell.put(False)
        self._thread.join(timeout_s)

    def _loop(self) -> None:
        while True:
            try:
                if not self._bell.get(timeout=self.poll_s):
                    return
            except queue.Empty:
                pass
            with self._lock:
                settlers = list(self._settlers)
            for settle in settlers:
                # A dead bookkeeper would leave every caller to settle its calls inline.
                try:
                    settle()
                except Exception:
                    log.exception("JIT: settling call records failed; later calls still settle")
