"""Background compilation: a benefit-ordered queue served by worker processes or threads."""

from __future__ import annotations

import concurrent.futures as cf
import heapq
import itertools
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dynshape_perception.core.runtime.shapes import Signature
from dynshape_perception.errors import CompileError

log = logging.getLogger(__name__)

# (model, weights, profile, dims, cache root) -> (library path, compile seconds)
CompileFn = Callable[
    [str, Mapping[str, np.ndarray], str, Mapping[str, int], str], tuple[str, float]
]
# Compiles run at lower CPU priority so that the frame loop keeps its cores.
WORKER_NICENESS = 10


def compile_to_cache(
    model: str,
    weights: Mapping[str, np.ndarray],
    profile: str,
    dims: Mapping[str, int],
    cache_root: str,
) -> tuple[str, float]:
    """Build (or fetch) a specialisation into the artefact cache; runs in a worker."""
    from dynshape_perception.core.compiler.cache import ArtefactCache
    from dynshape_perception.core.compiler.targets import load_profile
    from dynshape_perception.models import model_definition

    started = time.perf_counter()
    artefact = ArtefactCache(Path(cache_root)).get_or_build(
        model_definition(model), weights, load_profile(profile), dims
    )
    return str(artefact.library_path), time.perf_counter() - started


def _lower_priority() -> None:
    try:
        os.nice(WORKER_NICENESS)
    except OSError:
        pass


@dataclass(order=True)
class CompileJob:
    priority: float
    seq: int
    model: str = field(compare=False)
    key: Signature = field(compare=False)
    on_done: Callable[[Signature, str | None, float, str], None] = field(compare=False)


class CompilePool:
    """Runs compile jobs off the calling thread, most beneficial first, never twice at once."""

    def __init__(
        self,
        weights: Mapping[str, Mapping[str, np.ndarray]],
        profile: str,
        cache_root: Path,
        size: int = 1,
        mode: str = "process",
        timeout_s: float = 120.0,
        compile_fn: CompileFn = compile_to_cache,
    ) -> None:
        self._weights = weights
        self._profile = profile
        self._cache_root = str(cache_root)
        self._size = size
        self._mode = mode
        self._timeout_s = timeout_s
        self._compile_fn = compile_fn
        self._heap: list[CompileJob] = []
        self._pending: set[tuple[str, Signature]] = set()
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._paused = 0
        self._closed = False
        self._busy = 0
        self._executor = self._new_executor()
        self._workers = [
            threading.Thread(target=self._serve, name=f"jit-compile-{i}", daemon=True)
            for i in range(size)
        ]
        for worker in self._workers:
            worker.start()

    def _new_executor(self) -> cf.Executor:
        if self._mode == "process":
            # spawn: forking a process that holds TVM and rclpy threads is unsafe.
            return cf.ProcessPoolExecutor(
                max_workers=self._size,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=_lower_priority,
            )
        return cf.ThreadPoolExecutor(max_workers=self._size, thread_name_prefix="jit-build")

    def submit(
        self,
        model: str,
        key: Signature,
        benefit_ms: float,
        on_done: Callable[[Signature, str | None, float, str], None],
    ) -> bool:
        """Queue a compile unless the same (model, key) is queued or running."""
        with self._cv:
            if self._closed or (model, key) in self._pending:
                return False
            self._pending.add((model, key))
            heapq.heappush(
                self._heap, CompileJob(-benefit_ms, next(self._seq), model, key, on_done)
            )
            self._cv.notify()
            return True

    def in_flight(self, model: str, key: Signature) -> bool:
        with self._cv:
            return (model, key) in self._pending

    def pause(self) -> None:
        """Hold back new compiles (tier-1 work is running); nestable."""
        with self._cv:
            self._paused += 1

    def resume(self) -> None:
        with self._cv:
            self._paused = max(0, self._paused - 1)
            self._cv.notify_all()

    def idle(self) -> bool:
        with self._cv:
            return not self._heap and self._busy == 0

    def wait_idle(self, timeout_s: float) -> bool:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.idle():
                return True
            time.sleep(0.01)
        return self.idle()

    def _serve(self) -> None:
        while True:
            with self._cv:
                while not self._closed and (not self._heap or self._paused):
                    self._cv.wait()
                if self._closed:
                    return
                job = heapq.heappop(self._heap)
                self._busy += 1
            self._run(job)
            with self._cv:
                self._busy -= 1
                self._pending.discard((job.model, job.key))

    def _run(self, job: CompileJob) -> None:
        started = time.perf_counter()
        try:
            future = self._executor.submit(
                self._compile_fn,
                job.model,
                self._weights[job.model],
                self._profile,
                job.key.as_dict(),
                self._cache_root,
            )
            path, compile_s = future.result(timeout=self._timeout_s)
        except cf.TimeoutError:
            self._restart_executor()
            job.on_done(job.key, None, time.perf_counter() - started, "timeout")
            return
        except Exception as err:  # noqa: BLE001 - any compile failure is a strike, not a crash
            reason = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
            job.on_done(job.key, None, time.perf_counter() - started, reason)
            return
        job.on_done(job.key, path, compile_s, "")

    def _restart_executor(self) -> None:
        """A timed-out compile may never return: replace the workers."""
        old = self._executor
        self._executor = self._new_executor()
        if isinstance(old, cf.ProcessPoolExecutor):
            for proc in list(getattr(old, "_processes", {}).values()):
                proc.terminate()
        old.shutdown(wait=False, cancel_futures=True)

    def shutdown(self, wait: bool = True) -> None:
        with self._cv:
            self._closed = True
            self._heap.clear()
            self._cv.notify_all()
        for worker in self._workers:
            worker.join(timeout=5.0 if wait else 0.0)
        if isinstance(self._executor, cf.ProcessPoolExecutor):
            for proc in list(getattr(self._executor, "_processes", {}).values()):
                proc.terminate()
        self._executor.shutdown(wait=wait, cancel_futures=True)


def failing_compiler_fault_injector(
    model: str,
    weights: Mapping[str, np.ndarray],
    profile: str,
    dims: Mapping[str, int],
    cache_root: str,
) -> tuple[str, float]:
    """Fault injector for tests and drills: every compile fails like a broken toolchain."""
    raise CompileError(f"injected compile failure for {model} {dict(dims)}")
