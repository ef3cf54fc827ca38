"""What a process and everything it started hold: resident memory, threads, open files."""

from __future__ import annotations

import functools
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psutil

MB = 1024 * 1024
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class TreeUsage:
    """Summed over the process and its live descendants (compile workers, trackers)."""

    rss_bytes: int
    processes: int
    threads: int
    fds: int

    @property
    def rss_mb(self) -> float:
        return self.rss_bytes / MB

    def values(self, prefix: str = "process_tree.") -> dict[str, object]:
        return {
            f"{prefix}rss_mb": round(self.rss_mb, 1),
            f"{prefix}processes": self.processes,
            f"{prefix}threads": self.threads,
            f"{prefix}fds": self.fds,
        }


def tree_usage(pid: int | None = None) -> TreeUsage:
    """The usage of ``pid`` (this process) and its descendants; one that exits meanwhile
    counts for nothing."""
    root = os.getpid() if pid is None else pid
    if _has_children_files():
        return _proc_tree_usage(root)
    return _psutil_tree_usage(root)


@functools.cache
def _has_children_files() -> bool:
    """Whether the kernel lists each thread's children (CONFIG_PROC_CHILDREN, Linux)."""
    return os.path.exists(f"/proc/self/task/{threading.get_native_id()}/children")


def _proc_tree_usage(root: int) -> TreeUsage:
    """Walks down from ``root`` through /proc/<pid>/task/<tid>/children: psutil's
    ``children(recursive=True)`` reads the stat file of every process on the host, which
    made this once-a-second reading take milliseconds on a busy one."""
    rss = threads = fds = alive = 0
    pending, seen = [root], set()
    while pending:
        pid = pending.pop()
        # A PID reused while the walk runs must not bring a member in twice.
        read = None if pid in seen else _read_member(pid)
        seen.add(pid)
        if read is None:
            continue
        (member_rss, member_threads, member_fds), children = read
        rss += member_rss
        threads += member_threads
        fds += member_fds
        alive += 1
        pending.extend(children)
    return TreeUsage(rss, alive, threads, fds)


def _read_member(pid: int) -> tuple[tuple[int, int, int], list[int]] | None:
    """(rss bytes, threads, fds) of ``pid`` and its children; None where it went (or is not
    ours to read) before all of it was read: it counts for nothing, as with psutil, and its
    children, reparented away, are out of the tree."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return None
    children: list[int] = []
    threads = 0
    for tid in tids:
        try:
            listed = _read(f"/proc/{pid}/task/{tid}/children")
        except OSError:
            # A thread that ended since the listing: the process lives on without it.
            continue
        threads += 1
        children.extend(int(child) for child in listed.split())
    try:
        resident_pages = int(_read(f"/proc/{pid}/statm").split()[1])
        open_fds = len(os.listdir(f"/proc/{pid}/fd"))
    except (OSError, ValueError, IndexError):
        return None
    return (resident_pages * _PAGE_SIZE, threads, open_fds), children


def _read(path: str) -> bytes:
    """A /proc file's text in the fewest system calls: each one releases the GIL, and the
    diagnostics thread then waits for it behind the lanes."""
    fd = os.open(path, os.O_RDONLY)
    try:
        parts = []
        while chunk := os.read(fd, 4096):
            parts.append(chunk)
        return b"".join(parts)
    finally:
        os.close(fd)


def _psutil_tree_usage(root_pid: int) -> TreeUsage:
    try:
        root = psutil.Process(root_pid)
        members = [root, *root.children(recursive=True)]
    except psutil.Error:
        return TreeUsage(0, 0, 0, 0)
    rss = threads = fds = alive = 0
    for proc in members:
        try:
            with proc.oneshot():
                rss += proc.memory_info().rss
                threads += proc.num_threads()
                fds += proc.num_fds()
        except psutil.Error:
            continue
        alive += 1
    return TreeUsage(rss, alive, threads, fds)


def tree_values(pools: Sequence[Any]) -> dict[str, object]:
    """Diagnostics values: this process tree's usage, and its compile pools' workers (the
    ``CompilePool`` of each engine, None where the JIT is off)."""
    live = [pool for pool in pools if pool is not None]
    return {
        **tree_usage().values(),
        "jit.compile_workers": sum(len(pool.worker_pids()) for pool in live),
        "jit.compile_worker_starts": sum(pool.worker_starts for pool in live),
        "jit.compile_worker_exits": sum(pool.worker_exits for pool in live),
    }


class PeakSampler:
    """The largest ``tree_usage`` of this process tree while the block runs, sampled every
    ``period_s`` on a thread of its own (a benchmark's harness and the nodes it started)."""

    def __init__(self, period_s: float = 0.5) -> None:
        self.period_s = period_s
        self.peak = TreeUsage(0, 0, 0, 0)
        # This process alone (the harness), at its own largest sample.
        self.own_peak_bytes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="peak-rss", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            usage = tree_usage()
            if usage.rss_bytes > self.peak.rss_bytes:
                self.peak = usage
            try:
                own = psutil.Process().memory_info().rss
            except psutil.Error:
                own = 0
            self.own_peak_bytes = max(self.own_peak_bytes, own)
            self._stop.wait(self.period_s)

    def __enter__(self) -> PeakSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
