"""What the executors queue and how they are set up: units of work, arrivals, options."""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Callable, Generator, Iterator, Sequence
from concurrent.futures import Future
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import numpy as np

from dynshape_perception.errors import ConfigError
from dynshape_perception.paramspec import OFF, derived, param
from dynshape_perception.scheduling.tiers import Tier

Lane = Literal["reserved", "shared"]
JobFn = Callable[[], Any]
# Why a unit never completed: a newer frame of its stream replaced it, it was refused at
# submission, it could no longer meet its deadline, degraded mode skipped it (speculative
# work), the executor shut down first, or the submitter cancelled its future.
DROP_REASONS = ("stale", "admission", "expired", "degraded", "shutdown", "cancelled")
# Sheds that mean overload (stale replacement and skipped speculation do not).
TROUBLE = frozenset({"admission", "expired"})
COST_SMOOTHING = 0.2
MAX_LANES = 16
MAX_RT_PRIORITY = 99
MAX_SWITCH_INTERVAL_MS = 100.0
MAX_ALLOCATOR_KEEP_MB = 65536
CostKey = tuple[str, int | None]


def size_bucket(size: int | None) -> int | None:
    """The power of two at or above ``size``: units within a factor of two share a cost."""
    if size is None:
        return None
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
        raise ConfigError(f"a unit's size must be an integer >= 0, got {size!r}")
    return 1 << max(0, int(size) - 1).bit_length()


class PoolControl(Protocol):
    """What the executor needs of a background compile pool (``Engine.pool``)."""

    def pause(self) -> None: ...

    def resume(self) -> None: ...


class WorkGate(Protocol):
    """What the executor holds while any unit is queued or runs (``Engine.gate``)."""

    def enter(self) -> None: ...

    def leave(self) -> None: ...


class WorkCount:
    """Frame work under way in a node (a ``WorkGate``): its callbacks and its executor's
    units, counted, so that nested and overlapping holders end it together.

    The listeners run each time the last of it ends, on the thread that ends it, which may
    hold the executor's lock: they must only signal, never block or take a lock of their own
    that waits on other work.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._busy = 0
        self._listeners: list[Callable[[], None]] = []
        self.ends = 0

    @property
    def busy(self) -> bool:
        return self._busy > 0

    def listen(self, on_end: Callable[[], None]) -> None:
        self._listeners.append(on_end)

    def enter(self) -> None:
        with self._lock:
            self._busy += 1

    def leave(self) -> None:
        with self._lock:
            if not self._busy:
                return
            self._busy -= 1
            if self._busy:
                return
            self.ends += 1
        for on_end in self._listeners:
            on_end()


@contextmanager
def holding(gates: Sequence[WorkGate]) -> Iterator[None]:
    """Enter every gate for the block, and leave each one entered however the block ends."""
    with ExitStack() as stack:
        for gate in gates:
            gate.enter()
            stack.callback(gate.leave)
        yield


@dataclass(frozen=True)
class Arrival:
    """A frame's arrival at the executor; deadlines count from ``arrival_s`` (executor clock)."""

    topic: str
    arrival_s: float
    stamp_s: float | None = None
    transport_ms: float | None = None


@dataclass(frozen=True)
class ExecutorOptions:
    """Structural settings (read-only node parameters); TierConfig holds the tunable ones.

    A field that a parameter of 0 turns off is None here unless set: the library leaves
    threads, scheduling and the interpreter as they are; the nodes' defaults are declared.
    """

    reserved_workers: int = param(
        1,
        "lanes that run tier-1 (collision) work only",
        read_only=True,
        low=0,
        high=MAX_LANES,
    )
    shared_workers: int = param(
        1,
        "lanes that run every tier, tier 1 first",
        read_only=True,
        low=1,
        high=MAX_LANES,
    )
    # Nice value of shared lanes (-20..19; below 0 needs CAP_SYS_NICE): a low value keeps
    # other processes from preempting a shared lane that holds the GIL, without the
    # real-time throttling a busy SCHED_FIFO lane meets.
    shared_nice: int | None = derived("the caller (no node parameter sets it)", None)
    # A lane blocks when idle, so a SCHED_FIFO reserved lane cannot starve the host.
    reserved_rt_priority: int | None = param(
        10,
        "SCHED_FIFO priority of the reserved lanes (needs CAP_SYS_NICE or an rtprio "
        "limit, else a warning); 0: normal scheduling",
        read_only=True,
        low=OFF,
        high=MAX_RT_PRIORITY,
        none_if=OFF,
    )
    # Priority inheritance for the GIL while tier-1 work is queued or running: no other
    # process preempts a shared lane holding the GIL that tier 1 waits for. Held only that
    # briefly, it never meets real-time throttling, which a busy SCHED_FIFO lane would.
    shared_boost_rt_priority: int | None = param(
        5,
        "SCHED_FIFO priority the shared lanes take while tier-1 work waits, below "
        "reserved_rt_priority; 0: never boosted",
        read_only=True,
        low=OFF,
        high=MAX_RT_PRIORITY,
        none_if=OFF,
    )
    # The default 5 ms GIL slice would let a lower-tier thread's Python code hold tier-1
    # work up for half its budget; a much shorter one makes two busy lanes hand the GIL
    # over so often that the switches cost both more than the waits they save.
    switch_interval_ms: float | None = param(
        2.0,
        "GIL switch interval while the executor runs, so that lower-tier Python code "
        "holds tier 1 up briefly; 0: the interpreter's",
        read_only=True,
        low=float(OFF),
        high=MAX_SWITCH_INTERVAL_MS,
        none_if=OFF,
    )
    # NumPy's BLAS threads are process-wide and spin after each call.
    blas_threads: int | None = param(
        1,
        "threads of NumPy's OpenBLAS while the executor runs: with more, a lane's BLAS "
        "call waits on BLAS workers that other lanes pre-empt; 0: left as it is",
        read_only=True,
        low=OFF,
        high=MAX_LANES,
        none_if=OFF,
    )
    opencv_threads: int | None = param(
        1,
        "threads of OpenCV (the clustering) while the executor runs: with more, a call "
        "waits on OpenCV workers that take a core from the other lanes; 0: left as it is",
        read_only=True,
        low=OFF,
        high=MAX_LANES,
        none_if=OFF,
    )
    # A frame's clouds are freed and allocated again every frame: returned to the system in
    # between, their pages are faulted in anew each time.
    allocator_keep_mb: int | None = param(
        512,
        "freed memory the C allocator (glibc) keeps for reuse instead of returning it to the "
        "system, arrays up to 32 MB coming from its heaps; 0: the allocator's defaults",
        read_only=True,
        low=OFF,
        high=MAX_ALLOCATOR_KEEP_MB,
        none_if=OFF,
    )
    latency_window: int = derived("the library (no node parameter sets it)", 100_000)

    def __post_init__(self) -> None:
        if self.reserved_workers < 0 or self.shared_workers < 1:
            raise ConfigError("need reserved_workers >= 0 and shared_workers >= 1")
        if self.shared_nice is not None and not -20 <= self.shared_nice <= 19:
            raise ConfigError(f"shared_nice must lie in [-20, 19], got {self.shared_nice}")
        switch = self.switch_interval_ms
        if switch is not None and not 0.0 < switch <= MAX_SWITCH_INTERVAL_MS:
            raise ConfigError("switch_interval_ms must lie in (0, 100]")
        if self.latency_window < 1:
            raise ConfigError("latency_window must be >= 1")
        if self.blas_threads is not None and self.blas_threads < 1:
            raise ConfigError(f"blas_threads must be >= 1, got {self.blas_threads}")
        if self.allocator_keep_mb is not None and self.allocator_keep_mb < 1:
            raise ConfigError(f"allocator_keep_mb must be >= 1, got {self.allocator_keep_mb}")
        if self.opencv_threads is not None and self.opencv_threads < 1:
            raise ConfigError(f"opencv_threads must be >= 1, got {self.opencv_threads}")
        for name in ("reserved_rt_priority", "shared_boost_rt_priority"):
            value = getattr(self, name)
            if value is not None and not 1 <= value <= 99:
                raise ConfigError(f"{name} must lie in [1, 99]")
        boost, reserved = self.shared_boost_rt_priority, self.reserved_rt_priority
        if boost is not None and reserved is not None and reserved <= boost:
            raise ConfigError("shared_boost_rt_priority must stay below reserved_rt_priority")


@dataclass(eq=False)
class Work:
    """One unit of work: a callable, or a generator whose every ``yield`` ends a chunk."""

    fn: JobFn
    tier: Tier
    name: str
    arrival: Arrival
    deadline_s: float
    seq: int
    stream: str | None
    speculative: bool
    est_ms: float | None
    future: Future[Any]
    # Input size (points, agents): the cost is estimated per (name, size bucket).
    size: int | None = None
    gen: Generator[Any, None, Any] | None = None
    state: str = "queued"
    chunks: int = 0
    service_ms: float = 0.0
    started_s: float | None = None
    # Queued or running tier-1 work: shared lanes stay boosted while any is.
    active: bool = False


class Window:
    """The newest ``size`` samples, in a preallocated array.

    A snapshot copies them under the executor's lock: one array copy is a fraction of a
    millisecond where a 100,000-sample deque took several, holding every lane up each time.
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ConfigError(f"a sample window holds at least 1, got {size}")
        self._values = np.empty(size, np.float64)
        self._next = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def append(self, value: float) -> None:
        self._values[self._next] = value
        self._next = (self._next + 1) % self._values.size
        self._count = min(self._count + 1, self._values.size)

    def copy(self) -> np.ndarray:
        """The samples held, oldest first."""
        if self._count < self._values.size:
            return self._values[: self._count].copy()
        return np.roll(self._values, -self._next)


@dataclass
class TierStats:
    window: int
    submitted: int = 0
    completed: int = 0
    misses: int = 0
    failed: int = 0
    dropped: Counter[str] = field(default_factory=Counter)
    # Units refused or expired since the tier last completed one, and how often that run
    # reached TierConfig.starvation_frames.
    unserved: int = 0
    starvations: int = 0
    latency_ms: Window = field(init=False)
    wait_ms: Window = field(init=False)

    def __post_init__(self) -> None:
        self.latency_ms = Window(self.window)
        self.wait_ms = Window(self.window)
