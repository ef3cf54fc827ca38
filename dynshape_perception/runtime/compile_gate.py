"""Background compiles held back while a node's frames are under way, and briefly after."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Protocol


class Yielding(Protocol):
    """What the gate needs of a compile pool (``CompilePool``)."""

    def enter_yield(self) -> None: ...

    def leave_yield(self) -> None: ...


class CompileGate:
    """Keeps the pools' compiles stopped while work is under way and for ``hold_ms`` after.

    Work is counted, so that nested and overlapping holders (a node's frame callback, its
    executor's units) keep it shut together. A compile beside a frame takes the cores, caches
    and memory bandwidth the frame's NumPy stages need; one resumed in the few milliseconds
    between the frames of a saturated input is still running as the next one starts. At a
    lidar's pace the node is idle for most of each period, and the compiles run then.

    A keeper thread resumes the pools once the hold has passed; without one (``keeper``
    False), ``poll`` does.
    """

    def __init__(
        self,
        pools: Sequence[Yielding],
        hold_ms: float,
        clock: Callable[[], float] = time.monotonic,
        keeper: bool = True,
    ) -> None:
        self._pools = list(pools)
        self._hold_s = max(0.0, hold_ms) / 1e3
        self._clock = clock
        # The pools' own locks are taken under this one, never the other way round: a stop
        # and a resume never swap places on their way out.
        self._cv = threading.Condition()
        self._busy = 0
        self._shut = False
        # Set only while the gate is shut and no work is under way: the hold runs from here.
        self._idle_since: float | None = None
        self._closed = False
        self.stops = 0
        self._thread: threading.Thread | None = None
        if self._pools and keeper and self._hold_s > 0.0:
            self._thread = threading.Thread(target=self._keep, name="compile-gate", daemon=True)
            self._thread.start()

    @property
    def shut(self) -> bool:
        return self._shut

    def enter(self) -> None:
        """Work begins: the pools' compiles stop, if they run."""
        if not self._pools:
            return
        with self._cv:
            self._busy += 1
            self._idle_since = None
            if self._shut or self._closed:
                return
            self._shut = True
            self.stops += 1
            for pool in self._pools:
                pool.enter_yield()

    def leave(self) -> None:
        """Work ends: once none is left for ``hold_ms``, the compiles run again."""
        if not self._pools:
            return
        with self._cv:
            self._busy = max(0, self._busy - 1)
            if self._busy or not self._shut:
                return
            self._idle_since = self._clock()
            self._poll_locked()
            self._cv.notify()

    def poll(self) -> None:
        """Resume the compiles if the hold has passed (where no keeper thread runs)."""
        with self._cv:
            self._poll_locked()

    def close(self) -> None:
        """Resume what the gate holds, and hold nothing from now on."""
        with self._cv:
            self._closed = True
            if self._shut:
                self._open_locked()
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _resume_at_locked(self) -> float | None:
        """When the hold ends (gate clock); None while work is under way or nothing is held."""
        since = self._idle_since
        return None if since is None else since + self._hold_s

    def _poll_locked(self) -> None:
        resume_at = self._resume_at_locked()
        if resume_at is not None and self._clock() >= resume_at:
            self._open_locked()

    def _open_locked(self) -> None:
        self._shut = False
        self._idle_since = None
        for pool in self._pools:
            pool.leave_yield()

    def _keep(self) -> None:
        with self._cv:
            while not self._closed:
                resume_at = self._resume_at_locked()
                if resume_at is None:
                    self._cv.wait()
                elif (left := resume_at - self._clock()) > 0.0:
                    self._cv.wait(left)
                else:
                    self._open_locked()
