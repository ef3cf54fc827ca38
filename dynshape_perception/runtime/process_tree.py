"""What a process and everything it started hold: resident memory, threads, open files."""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import psutil

MB = 1024 * 1024


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
    try:
        root = psutil.Process(os.getpid() if pid is None else pid)
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
