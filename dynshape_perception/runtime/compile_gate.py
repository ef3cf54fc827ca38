"""Background compiles held back while frames are under way (the node's own, or on the host any
process's), and briefly after."""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from dynshape_perception.runtime.host_work import HostState


class Yielding(Protocol):
    """What the gate needs of a compile pool (``CompilePool``)."""

    @property
    def running(self) -> bool: ...

    @property
    def has_work(self) -> bool: ...

    def add_waker(self, wake: Callable[[], None]) -> None: ...

    def enter_yield(self) -> None: ...

    def leave_yield(self) -> None: ...


class HostView(Protocol):
    """The work of every process on the host (``host_work.HostWork``)."""

    def enter(self) -> None: ...

    def leave(self) -> None: ...

    def state(self) -> HostState: ...


# How often an open gate whose pools compile looks for another process's work: the compile
# runs beside that work until the next look.
HOST_POLL_S = 0.002
# Where nothing compiles, only a compile started since the last look can be beside it.
HOST_IDLE_POLL_S = 0.05
# Shut for another process's work, the gate opens no sooner than the hold after that work
# ends: it looks again after the hold, or after this where the hold is shorter.
HOST_BUSY_POLL_S = 0.005


class CompileGate:
    """Keeps the pools' compiles stopped while work is under way and for ``hold_ms`` after.

    Work is counted, so that nested and overlapping holders (a node's frame callback, its
    executor's units) keep it shut together. A compile beside a frame takes the cores, caches
    and memory bandwidth the frame's NumPy stages need; one resumed in the few milliseconds
    between the frames of a saturated input is still running as the next one starts. At a
    lidar's pace the node is idle for most of each period, and the compiles run then.

    With ``host``, the work of the host's other processes (the other nodes of a launch)
    holds the pools too: it stores which work is under way and when it last ended, and the
    keeper looks at it while the gate is open.

    A keeper thread resumes the pools once the hold has passed; without one (``keeper``
    False), ``poll`` does. Where the pools have nothing queued or running, the gate rests:
    shut, it watches neither the hold nor the host; a pool wakes it as a compile is queued
    and once its last has ended. A frame then costs the gate no thread wake-up, where each
    read of the host's table cost every node's keeper a share of the GIL beside its frame.
    """

    def __init__(
        self,
        pools: Sequence[Yielding],
        hold_ms: float,
        clock: Callable[[], float] = time.monotonic,
        keeper: bool = True,
        host: HostView | None = None,
    ) -> None:
        self._pools = list(pools)
        self._hold_s = max(0.0, hold_ms) / 1e3
        self._clock = clock
        self._host = host if self._pools else None
        # The pools' own locks are taken under this one, never the other way round: a stop
        # and a resume never swap places on their way out.
        self._cv = threading.Condition()
        self._busy = 0
        self._shut = False
        # When this process's work last ended (gate clock).
        self._ended = -math.inf
        self._closed = False
        self.stops = 0
        self.host_stops = 0
        self._thread: threading.Thread | None = None
        if self._pools and keeper and (self._hold_s > 0.0 or self._host is not None):
            self._thread = threading.Thread(target=self._keep, name="compile-gate", daemon=True)
            self._thread.start()
        for pool in self._pools:
            pool.add_waker(self._wake)

    @property
    def shut(self) -> bool:
        return self._shut

    def enter(self) -> None:
        """Work begins: the pools' compiles stop, if they run."""
        if not self._pools:
            return
        with self._cv:
            self._busy += 1
            if self._busy == 1 and self._host is not None:
                self._host.enter()
            if self._shut or self._closed:
                return
            self._shut_locked()
            self.stops += 1

    def leave(self) -> None:
        """Work ends: once none is left (on the host too, with ``host``) for ``hold_ms``, the
        compiles run again."""
        if not self._pools:
            return
        with self._cv:
            if self._busy == 0:
                return
            self._busy -= 1
            if self._busy:
                return
            self._ended = self._clock()
            if self._host is not None:
                self._host.leave()
            if self._shut and self._resting_locked():
                return
            # With a hold, nothing opens now: the keeper times it (a read of the host's
            # table here would be one more per frame, on the frame's thread).
            if self._hold_s == 0.0:
                self._step_locked()
            self._cv.notify()

    def _wake(self) -> None:
        """A compile was queued, or the last ended (called by a pool, outside its lock)."""
        with self._cv:
            if self._thread is None:
                self._step_locked()
            else:
                self._cv.notify()

    def _resting_locked(self) -> bool:
        """No pool has a compile queued or running: nothing for the gate to hold back."""
        return not any(pool.has_work for pool in self._pools)

    def poll(self) -> float | None:
        """Resume or stop the compiles as the work says (where no keeper thread runs); how
        long until that may change (None: until work or a pool changes it)."""
        with self._cv:
            return self._step_locked()

    def close(self) -> None:
        """Resume what the gate holds, and hold nothing from now on."""
        with self._cv:
            self._closed = True
            if self._shut:
                self._open_locked()
            self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()

    def _step_locked(self) -> float | None:
        """Open or shut the pools as the work says; returns how long until that may change
        (None: until this process's own work changes it)."""
        if self._closed or self._busy:
            return None
        if self._resting_locked():
            if not self._shut:
                self._shut_locked()
            return None
        now = self._clock()
        ended = self._ended
        if self._host is not None:
            host = self._host.state()
            if host.busy:
                if not self._shut:
                    self._shut_locked()
                    self.host_stops += 1
                return max(self._hold_s, HOST_BUSY_POLL_S)
            ended = max(ended, host.ended)
        if self._shut:
            resume_at = ended + self._hold_s
            if now < resume_at:
                return resume_at - now
            self._open_locked()
        if self._host is None:
            return None
        return HOST_POLL_S if any(pool.running for pool in self._pools) else HOST_IDLE_POLL_S

    def _shut_locked(self) -> None:
        self._shut = True
        for pool in self._pools:
            pool.enter_yield()

    def _open_locked(self) -> None:
        self._shut = False
        for pool in self._pools:
            pool.leave_yield()

    def _keep(self) -> None:
        with self._cv:
            while not self._closed:
                self._cv.wait(self._step_locked())
