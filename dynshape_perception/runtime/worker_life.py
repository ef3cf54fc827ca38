"""A compile worker's start: tied to its parent's life, lean, then the compiler imported.

Light on purpose: the pool pickles these functions by reference, so a spawned worker imports
this module before it runs them, and nothing here may import TVM before ``keep_unused_out``.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import threading
import time
from collections.abc import Callable

from dynshape_perception.runtime.lean_imports import keep_unused_out

# How often a worker looks whether the process that spawned it is still there.
PARENT_POLL_S = 0.1
# prctl(2): the signal a process gets when the thread that created it ends.
PR_SET_PDEATHSIG = 1


def start_worker() -> None:
    """Worker initialiser: import the compiler before the first job."""
    import dynshape_perception.compiler.cache  # noqa: F401


def lean_start() -> None:
    """Worker initialiser of a lean start: the compiler is imported with the first compile."""


def init_worker(start: Callable[[], None], parent_pid: int) -> None:
    """Tie the worker's life to its parent's, then run ``start``.

    A parent ended by SIGKILL runs no clean-up: without this its workers (hundreds of MB
    each) would wait on their job queue under PID 1 for good, and the resource tracker,
    which holds on while any of them lives, with them.
    """
    keep_unused_out()
    _wake_on_parent_death()
    own_group = _own_process_group()
    threading.Thread(
        target=_watch_parent, args=(parent_pid, own_group), name="parent-watch", daemon=True
    ).start()
    start()


def _own_process_group() -> bool:
    """Lead a process group of its own: what the worker starts (a compiler) ends with it,
    and a terminal's Ctrl-C reaches the parent alone, which closes the pool. It also tells
    the parent that the guard is set (``guarded``)."""
    try:
        os.setpgid(0, 0)
    except OSError:
        return False
    return True


def _wake_on_parent_death() -> None:
    """SIGCONT when the spawning thread ends: a worker stopped through a heavy call runs no
    code, so it would never see its parent gone. Not SIGKILL: the spawning thread may end
    before the process does, and then the worker is to live on."""
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGCONT), 0, 0, 0)
    except (OSError, AttributeError):
        pass


def _watch_parent(parent_pid: int, own_group: bool) -> None:
    """Once the parent is gone (the worker was handed to another), end the worker's group."""
    while os.getppid() == parent_pid:
        time.sleep(PARENT_POLL_S)
    if own_group:
        try:
            os.killpg(0, signal.SIGKILL)
        except OSError:
            pass
    os._exit(1)
