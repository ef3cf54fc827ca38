"""``session_left``: a session's helper that ends on its own after its leader (as
multiprocessing's resource tracker does, on EOF) is not left over; one that stays is."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from dynshape_perception.testing.processes import session_left, session_members

# The leader starts a child in its session that reads the pipe until EOF, prints the child's
# pid, and exits.
LEADER = """
import subprocess, sys
fd = int(sys.argv[1])
child = subprocess.Popen(
    [sys.executable, "-c", "import os, sys\\nwhile os.read(int(sys.argv[1]), 1): pass", str(fd)],
    pass_fds=(fd,),
)
print(child.pid, flush=True)
"""


@contextmanager
def orphan_reading_a_pipe() -> Iterator[tuple[int, int, Callable[[], None]]]:
    """(the ended leader's session, its orphaned child, what closes the pipe's write end)."""
    read_end, write_end = os.pipe()
    closed = threading.Lock()

    def close() -> None:
        # Once only: a second close could hit a descriptor reopened meanwhile.
        if closed.acquire(blocking=False):
            os.close(write_end)

    try:
        proc = subprocess.Popen(
            [sys.executable, "-c", LEADER, str(read_end)],
            stdout=subprocess.PIPE,
            text=True,
            start_new_session=True,
            pass_fds=(read_end,),
        )
        os.close(read_end)
        assert proc.stdout is not None
        child = int(proc.stdout.readline())
        proc.stdout.close()
        proc.wait(timeout=30.0)
        yield proc.pid, child, close
    finally:
        close()


def test_a_child_that_ends_during_the_wait_is_not_left() -> None:
    with orphan_reading_a_pipe() as (session, child, close):
        assert child in session_members(session)
        closer = threading.Timer(0.3, close)
        closer.start()
        try:
            assert session_left(session, wait_s=30.0) == {}
        finally:
            closer.join()


def test_a_child_that_stays_is_left_after_the_wait() -> None:
    with orphan_reading_a_pipe() as (session, child, _close):
        assert list(session_left(session, wait_s=0.5)) == [child]
