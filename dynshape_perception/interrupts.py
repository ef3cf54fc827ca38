"""A node's start-up ends at once on SIGINT or SIGTERM, except inside sections it must finish."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from types import FrameType

# Only the standard library here: the handlers are installed before the heavy imports.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
# ``kill -USR1 <pid>``: every thread's Python stack to the node's stderr, and the node runs on.
STACKS_SIGNAL = signal.SIGUSR1


class StartupInterrupted(BaseException):
    """SIGINT or SIGTERM before the node spins. A BaseException, like KeyboardInterrupt, so
    that no ``except Exception`` on the way (imports, engine builds, warm-up waits) holds it
    while the ``except BaseException`` clean-ups still run."""


class _State:
    starting = False
    # The first stop signal of start-up: C code an import or a build calls into may turn the
    # exception raised under it into one of its own, and this tells what that one was.
    requested: int | None = None
    # Nesting depth of ``uninterrupted`` sections on the main thread, and the signal that
    # arrived inside one.
    depth = 0
    pending: int | None = None


def _interrupt(signum: int, frame: FrameType | None) -> None:
    if not _State.starting:
        return
    if _State.requested is None:
        _State.requested = signum
    if _State.depth:
        _State.pending = signum
        return
    # Once: a second signal must not cut the clean-up of the first short.
    _State.starting = False
    raise StartupInterrupted(signum)


def install_handlers() -> None:
    """SIGINT and SIGTERM end start-up from here on (call it on the main thread, first).
    ``rclpy.init`` installs its own handlers later, which shut its context down and then
    call these."""
    _State.starting = True
    _State.pending = None
    _State.requested = None
    for sig in STOP_SIGNALS:
        signal.signal(sig, _interrupt)


def requested() -> int | None:
    """The signal that asked start-up to end, if one did."""
    return _State.requested


def startup_done() -> None:
    """From here a signal only shuts rclpy's context down, and the node's spin returns.

    A stop asked for during start-up ends it here if it has not yet: Python drops an
    exception raised where it cannot propagate ("Exception ignored in"), as when the handler
    runs inside a weakref callback of the import machinery, and start-up then went on to
    spin with the signal spent.
    """
    _State.starting = False
    if _State.requested is not None:
        raise StartupInterrupted(_State.requested)


def shutting_down() -> None:
    """A stop signal from here on repeats a request already under way: ignored. The
    interpreter's finalisation puts the default handlers back where Python ones are set, and
    those would end the process by the signal instead of with exit status 0."""
    if threading.current_thread() is not threading.main_thread():
        return
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


@contextmanager
def uninterrupted() -> Iterator[None]:
    """A section a signal must not cut in two (spawning a worker process: one cut between its
    start and its hand-shake would be left reading a closed pipe). A signal inside it takes
    effect at its end."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    _State.depth += 1
    try:
        yield
    finally:
        _State.depth -= 1
        if _State.depth == 0 and _State.pending is not None:
            signum, _State.pending = _State.pending, None
            if _State.starting:
                _State.starting = False
                raise StartupInterrupted(signum)
