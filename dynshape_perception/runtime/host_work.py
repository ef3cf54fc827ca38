"""Frame work under way in any process of one user on this host, in a file of shared memory.

A node's compile gate sees its own frames only. In the three-node launch the later nodes
idle while the lidar node computes the next scan, so their gates open then, and their
compiles (niced and at idle priority, yet on the same cores, caches and memory bandwidth)
run beside that frame. Each process writes its own slot (its pid, since when its work is
under way, when it last ended); every gate reads them all.
"""

from __future__ import annotations

import atexit
import contextlib
import fcntl
import math
import mmap
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np

from dynshape_perception.errors import ConfigError

SLOTS = 64
SLOT = np.dtype([("pid", "<i8"), ("since", "<f8"), ("ended", "<f8")])
# A process busy this long without an end is hung or gone under a reused pid: it holds no
# one's compiles back any more.
STALE_BUSY_S = 10.0
SHM_DIR = Path("/dev/shm")


class HostState(NamedTuple):
    """What the slots say: whether any process's work is under way, and when the last ended
    (clock seconds; -inf if none has)."""

    busy: bool
    ended: float


def default_path() -> Path | None:
    """One file per user, in shared memory where the host has it (Linux)."""
    if not SHM_DIR.is_dir():
        return None
    return SHM_DIR / f"dynshape_perception-work-{os.getuid()}"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class HostWork:
    """This process's slot in the host's table of frame work, counted across its holders.

    Slots are written without a lock, one 8-byte store per field, each by its own process:
    a read that races a write sees the old or the new time, so at worst a compile stops or
    runs one poll late. Only claiming a slot takes the file's lock.
    """

    def __init__(self, path: Path, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self._clock = clock
        self._lock = threading.Lock()
        self._count = 0
        # A child forked from this process shares the mapping, not the slot.
        self._pid = os.getpid()
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as err:
            raise ConfigError(f"cannot open the host's work table {path}: {err}") from err
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                if os.fstat(fd).st_size < SLOTS * SLOT.itemsize:
                    os.ftruncate(fd, SLOTS * SLOT.itemsize)
                self._map = mmap.mmap(fd, SLOTS * SLOT.itemsize)
                self._slots = np.frombuffer(self._map, dtype=SLOT, count=SLOTS)
                try:
                    self._index = self._claim()
                except ConfigError:
                    del self._slots
                    self._map.close()
                    raise
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError as err:
            raise ConfigError(f"cannot use the host's work table {path}: {err}") from err
        finally:
            os.close(fd)

    def _claim(self) -> int:
        own = os.getpid()
        # A list, not a view: a view left in a failed claim's traceback would keep the map open.
        for index, pid in enumerate(self._slots["pid"].tolist()):
            if pid == 0 or pid == own or not _alive(pid):
                self._slots[index] = (own, 0.0, 0.0)
                return index
        raise ConfigError(f"the host's work table {self.path} has no free slot of {SLOTS}")

    def _writable(self) -> bool:
        return not self._map.closed and os.getpid() == self._pid

    def enter(self) -> None:
        with self._lock:
            if not self._writable():
                return
            self._count += 1
            if self._count == 1:
                self._slots["since"][self._index] = self._clock()

    def leave(self) -> None:
        with self._lock:
            if self._count == 0 or not self._writable():
                return
            self._count -= 1
            if self._count == 0:
                # The end first: a reader that sees the slot idle sees when it ended.
                self._slots["ended"][self._index] = self._clock()
                self._slots["since"][self._index] = 0.0

    def state(self) -> HostState:
        with self._lock:
            if self._map.closed:
                return HostState(False, -math.inf)
            slots = self._slots.copy()
        live = slots["pid"] != 0
        now = self._clock()
        since = slots["since"]
        busy = live & (since > 0.0) & (now - since < STALE_BUSY_S)
        own = os.getpid()
        under_way = any(pid == own or _alive(pid) for pid in slots["pid"][busy].tolist())
        ended = slots["ended"][live & (slots["ended"] > 0.0)]
        return HostState(under_way, float(ended.max()) if ended.size else -math.inf)

    def close(self) -> None:
        with self._lock:
            if self._map.closed:
                return
            if int(self._slots["pid"][self._index]) == os.getpid() == self._pid:
                self._slots[self._index] = (0, 0.0, 0.0)
            del self._slots
            self._map.close()


_SHARED: dict[Path, HostWork] = {}
_SHARED_LOCK = threading.Lock()


def shared(path: Path) -> HostWork:
    """The process's one slot in ``path``: its engines' gates count their work together."""
    with _SHARED_LOCK:
        work = _SHARED.get(path)
        if work is None:
            if not _SHARED:
                atexit.register(close_shared)
            work = _SHARED[path] = HostWork(path)
        return work


def close_shared() -> None:
    with _SHARED_LOCK:
        for work in _SHARED.values():
            with contextlib.suppress(BufferError):
                work.close()
        _SHARED.clear()
