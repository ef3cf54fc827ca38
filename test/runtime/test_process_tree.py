"""The process tree's usage: the /proc children walk against psutil's scan, with real processes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import psutil
import pytest

from dynshape_perception.runtime import process_tree
from dynshape_perception.runtime.process_tree import tree_usage

pytestmark = pytest.mark.skipif(
    not process_tree._has_children_files(), reason="the kernel lists no children per thread"
)


def psutil_pids(pid: int) -> set[int]:
    root = psutil.Process(pid)
    return {pid, *(child.pid for child in root.children(recursive=True))}


def walked_pids(pid: int) -> set[int]:
    found, pending = set(), [pid]
    while pending:
        member = pending.pop()
        read = process_tree._read_member(member)
        if read is not None:
            found.add(member)
            pending.extend(read[1])
    return found


def wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "the processes did not start"
        time.sleep(0.02)


@pytest.fixture
def family() -> Iterator[dict[str, subprocess.Popen[bytes]]]:
    """A sleeping child, a shell with a sleeping grandchild, and a child started from a
    thread that stays alive (the kernel lists it under that thread, not the main one)."""
    procs: dict[str, subprocess.Popen[bytes]] = {}
    release = threading.Event()

    def start_from_thread() -> None:
        procs["from_thread"] = subprocess.Popen(["sleep", "60"])
        release.wait()

    starter = threading.Thread(target=start_from_thread)
    try:
        procs["child"] = subprocess.Popen(["sleep", "60"])
        procs["parent"] = subprocess.Popen(["sh", "-c", "sleep 60 & wait"], start_new_session=True)
        starter.start()
        wait_for(lambda: "from_thread" in procs)
        wait_for(lambda: len(psutil.Process(procs["parent"].pid).children()) == 1)
        yield procs
    finally:
        release.set()
        if starter.is_alive():
            starter.join()
        if "parent" in procs:
            os.killpg(procs["parent"].pid, signal.SIGKILL)
        for proc in procs.values():
            proc.kill()
            proc.wait()


def test_the_walk_finds_the_same_processes_as_psutil(
    family: dict[str, subprocess.Popen[bytes]],
) -> None:
    expected = psutil_pids(os.getpid())
    grandchild = psutil.Process(family["parent"].pid).children()[0].pid
    assert {grandchild, *(p.pid for p in family.values())} <= expected
    assert walked_pids(os.getpid()) == expected
    usage, scanned = tree_usage(), process_tree._psutil_tree_usage(os.getpid())
    assert usage.processes == scanned.processes == len(expected)
    assert usage.rss_bytes > 0 and usage.fds > 0
    # Another process's tree, as a benchmark's harness reads the nodes it started: idle
    # processes, whose threads and files hold still between the two readings.
    parent = family["parent"].pid
    assert walked_pids(parent) == {parent, grandchild}
    usage, scanned = tree_usage(parent), process_tree._psutil_tree_usage(parent)
    assert (usage.processes, usage.threads, usage.fds) == (2, scanned.threads, scanned.fds)
    assert usage.threads == 2 and usage.rss_bytes > 0


def test_a_child_that_exits_between_listing_and_reading_counts_for_nothing(
    family: dict[str, subprocess.Popen[bytes]],
) -> None:
    before = tree_usage()
    leaving = family["child"]
    listing = process_tree._read_member(os.getpid())
    assert listing is not None and leaving.pid in listing[1]
    leaving.kill()
    leaving.wait()
    assert process_tree._read_member(leaving.pid) is None
    after = tree_usage()
    assert after.processes == before.processes - 1
    assert leaving.pid not in walked_pids(os.getpid())


def test_a_process_that_is_gone_has_no_usage() -> None:
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    assert tree_usage(gone.pid) == process_tree.TreeUsage(0, 0, 0, 0)
    assert process_tree._psutil_tree_usage(gone.pid) == process_tree.TreeUsage(0, 0, 0, 0)


def test_a_thread_that_ends_during_the_walk_leaves_its_process_counted() -> None:
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            brief = [threading.Thread(target=time.sleep, args=(0.0005,)) for _ in range(8)]
            for thread in brief:
                thread.start()
            for thread in brief:
                thread.join()

    expected = tree_usage().processes
    churner = threading.Thread(target=churn)
    churner.start()
    try:
        counted = [tree_usage().processes for _ in range(2000)]
    finally:
        stop.set()
        churner.join()
    assert counted == [expected] * len(counted)
