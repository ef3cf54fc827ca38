"""Background compilation: a benefit-ordered queue served by worker processes or threads."""

from __future__ import annotations

import concurrent.futures as cf
import heapq
import itertools
import logging
import multiprocessing
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dynshape_perception.errors import CompileError, ConfigError
from dynshape_perception.runtime import compile_workers as workers
from dynshape_perception.runtime.compile_workers import DaemonThreadExecutor, compile_to_cache
from dynshape_perception.runtime.policy import InterferenceMeter
from dynshape_perception.runtime.shapes import Signature
from dynshape_perception.runtime.validation import CompileRequest, CompileResult
from dynshape_perception.runtime.worker_life import lean_start

log = logging.getLogger(__name__)

CompileFn = Callable[[CompileRequest, Mapping[str, np.ndarray]], CompileResult]
OnDone = Callable[[Signature, CompileResult | None, float, str], None]
# How often a worker waiting on a compile checks whether the pool was closed.
AWAIT_POLL_S = 0.2
QUIET_POLL_S = 0.01
ABANDONED_POLL_S = 1.0
# A thread pool must slow calls this much less than a process pool to be chosen, each
# judged on this many calls that ran while it compiled.
TRIAL_MARGIN = 0.02
TRIAL_SAMPLES = 200
# Where neither slows calls measurably more, threads win only if stops stretch a process's
# compiles at least this much (wall over running time): a process keeps a compiler crash
# out of the serving process.
TRIAL_STRETCH = 1.5
TRIAL_DRY_S = 10.0


class _CompileTimeout(Exception):
    """A compile ran past its timeout: distinct from a ``TimeoutError`` the compiler raises,
    which is its failure, not a hang."""


@dataclass(order=True)
class CompileJob:
    priority: float
    seq: int
    model: str = field(compare=False)
    key: Signature = field(compare=False)
    request: CompileRequest = field(compare=False)
    on_done: OnDone = field(compare=False)
    # Broken with a pool of several workers, where the crash may have been another's: run
    # again alone, where a crash is its own.
    alone: bool = field(default=False, compare=False)


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
        meter: InterferenceMeter | None = None,
        cache_max_bytes: int | None = None,
        idle_exit_s: float = 0.0,
    ) -> None:
        self._weights = weights
        self.meter = meter or InterferenceMeter(prior_weight=1.0)
        self.profile = profile
        self.cache_root = str(cache_root)
        self.cache_max_bytes = cache_max_bytes
        self._size = size
        if mode not in ("auto", "process", "thread"):
            raise ConfigError(f"compile mode must be auto, process or thread, got {mode!r}")
        # auto: process first, then thread, each until the meter has measured its slowdown
        # of live calls; then the one that slows calls less.
        self._auto = mode == "auto"
        self.mode = "process" if self._auto else mode
        self.choice: dict[str, Any] = {}
        # Wall and stopped seconds of the successful process compiles in the trial.
        self._trial_wall_s = 0.0
        self._trial_stopped_s = 0.0
        self._last_done = time.monotonic()
        # A job retried alone is running: no other starts beside it.
        self._solo = False
        self._timeout_s = timeout_s
        self._compile_fn = compile_fn
        self._heap: list[CompileJob] = []
        self._pending: set[tuple[str, Signature]] = set()
        # What may still submit compiles: dispatchers whose calls are not all settled.
        self._feeders: list[Callable[[], None]] = []
        # Told of each compile queued, and when none is left (a compile gate that rests while
        # nothing compiles).
        self._wakers: list[Callable[[], None]] = []
        self._seq = itertools.count()
        self._cv = threading.Condition()
        self._paused = 0
        self._closed = False
        # Compiles running: a plain attribute, since every call reads it before anything else.
        self.busy = 0
        self._yielding = 0
        self._stopped: list[int] = []
        # Compile threads that ran past their timeout and could not be stopped.
        self._abandoned: list[threading.Thread] = []
        self.yield_s = 0.0
        self.yields = 0
        self._yield_started = 0.0
        # The process worker's start-up job: done once it has imported the compiler.
        self._started: cf.Future[Any] | None = None
        # The workers were started lean (``start_lean``): they import the compiler with their
        # first compile, and a lean start replaces them when they retire.
        self._lean = False
        self._needs_import = False
        # Workers start with the first compile (``wait_started`` and ``start_lean`` start them
        # too) and end after ``idle_exit_s`` without one (0: they stay): hundreds of MB each,
        # idle.
        self._executor: cf.Executor | None = None
        self.idle_exit_s = idle_exit_s
        self.worker_starts = 0
        self.worker_exits = 0
        self._workers = [
            threading.Thread(target=self._serve, name=f"jit-compile-{i}", daemon=True)
            for i in range(size)
        ]
        for worker in self._workers:
            worker.start()

    def _new_executor(self, mode: str, lean: bool = False) -> cf.Executor:
        self.worker_starts += 1
        if mode == "process":
            # spawn: forking a process that holds TVM and rclpy threads is unsafe.
            pool = cf.ProcessPoolExecutor(
                max_workers=self._size,
                mp_context=multiprocessing.get_context("spawn"),
                initializer=workers.init_worker,
                initargs=(lean_start if lean else workers.start_worker, os.getpid()),
            )
            # Start the worker now: importing TVM would otherwise delay the first compile.
            # A lean one imports it with its first compile (``start_workers``).
            self._started = None if lean else pool.submit(workers.ready)
            self._needs_import = lean
            if lean:
                pool.submit(lean_start)
            # Lowered from here, not by the worker itself: its own code runs only after the
            # interpreter and TVM have been imported, seconds of CPU beside the serving thread.
            for proc in workers.processes(pool):
                if proc.pid is not None:
                    workers.lower_priority(proc.pid)
            return pool
        self._started = None
        self._needs_import = False
        return DaemonThreadExecutor("jit-build")

    def _executor_locked(self) -> cf.Executor:
        """The workers, started now if none run."""
        if self._executor is None:
            self._executor = self._new_executor(self.mode)
        return self._executor

    def worker_pids(self) -> list[int]:
        """The compile worker processes alive now (none for threads or before a compile)."""
        with self._cv:
            executor = self._executor
        if executor is None:
            return []
        return [p.pid for p in workers.processes(executor) if p.pid is not None and p.is_alive()]

    def _retire_in_locked(self) -> float | None:
        """Seconds until idle workers are to exit; None while they are not to."""
        if self._executor is None or self.idle_exit_s <= 0 or self.busy or self._heap:
            return None
        # A lean worker holds no compiler: nothing worth its restart to free.
        if self._needs_import:
            return None
        if self._abandoned or self._stopped or self._closed:
            return None
        return max(0.0, self._last_done + self.idle_exit_s - time.monotonic())

    def _retire_locked(self) -> None:
        idle_s = time.monotonic() - self._last_done
        executor, self._executor, self._started = self._executor, None, None
        if executor is None:
            return
        workers.terminate_processes(executor)
        executor.shutdown(wait=False, cancel_futures=True)
        self.worker_exits += 1
        if self._lean and self.mode == "process":
            self._executor = self._new_executor(self.mode, lean=True)
            log.info("JIT: compile workers idle for %.0f s: replaced by lean ones", idle_s)
            return
        log.info("JIT: compile workers idle for %.0f s: stopped until the next compile", idle_s)

    def start_workers(self) -> None:
        """Start the workers now rather than with the first compile, and have them import
        the compiler (a lean start's workers import it now)."""
        with self._cv:
            if self._closed:
                return
            executor = self._executor_locked()
            if self._needs_import:
                self._needs_import = False
                self._started = executor.submit(workers.start_worker)

    def start_lean(self) -> None:
        """Start the worker processes now, without the compiler (process mode only).

        Spawning a worker costs this process milliseconds, which would stretch a frame if a
        compile mid-run started it; a lean worker is an interpreter of about 20 MB, and it
        imports the compiler with its first compile, as a compile runs: at idle priority,
        stopped through the frames of a busy executor.
        """
        with self._cv:
            if self._closed or self.mode != "process" or self._executor is not None:
                return
            self._lean = True
            self._executor = self._new_executor(self.mode, lean=True)

    def wait_started(self, timeout_s: float) -> bool:
        """Whether the worker process has imported the compiler (threads need nothing);
        the workers start now if none run.

        Until then a compile's clock also runs through the import, seconds under load. A
        worker that died starting is not ready either: its compiles fail, as strikes.
        """
        self.start_workers()
        with self._cv:
            started = self._started
        if started is None:
            return True
        try:
            started.result(timeout=timeout_s)
        except cf.TimeoutError:
            return False
        # A worker that died starting (BrokenExecutor), or a lean one whose import raised.
        except Exception as err:  # noqa: BLE001 - a failed start is logged and struck
            log.warning("JIT: the compile worker failed to start: %s", err)
            return False
        return True

    def _start_error(self) -> BaseException | None:
        """What a lean worker's import of the compiler raised, if it did."""
        with self._cv:
            started = self._started
        if started is None or not started.done() or started.cancelled():
            return None
        error = started.exception()
        return None if isinstance(error, cf.BrokenExecutor) else error

    def _replace_executor(self, mode: str) -> None:
        """New workers in ``mode``; the old ones are ended, whatever they were doing.

        Threads cannot be ended: those still compiling are kept count of, and while as many
        run as the pool has workers, no new compile starts beside them. The mode changes only
        once the new workers exist: a failed start leaves the pool as it was.
        """
        old = self._executor
        self._executor = self._new_executor(mode)
        self.mode = mode
        if old is None:
            return
        workers.terminate_processes(old)
        if isinstance(old, DaemonThreadExecutor):
            self._abandoned.extend(old.threads)
        old.shutdown(wait=False, cancel_futures=True)

    def _held_by_abandoned_locked(self) -> bool:
        self._abandoned = [t for t in self._abandoned if t.is_alive()]
        return len(self._abandoned) >= self._size

    def submit(self, request: CompileRequest, benefit_ms: float, on_done: OnDone) -> bool:
        """Queue a compile unless the same (model, key) is queued or running."""
        model, key = request.model, request.key
        with self._cv:
            if self._closed or (model, key) in self._pending:
                return False
            self._pending.add((model, key))
            heapq.heappush(
                self._heap,
                CompileJob(-benefit_ms, next(self._seq), model, key, request, on_done),
            )
            self._cv.notify()
            wakers = list(self._wakers)
        # Outside the lock: a gate takes its own lock first, then the pool's.
        for wake in wakers:
            wake()
        return True

    def add_waker(self, wake: Callable[[], None]) -> None:
        """``wake`` is called after each compile is queued and once none is left queued or
        running, outside the pool's lock."""
        with self._cv:
            self._wakers.append(wake)

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
            self._notify_queued_locked()

    def _notify_queued_locked(self) -> None:
        """Wake the workers to what is queued; with nothing queued none of them can start,
        and a wake-up at every tier-1 unit or frame would only take a core from it."""
        if self._heap:
            self._cv.notify_all()

    def compiling_now(self) -> str | None:
        """The mode of a compile running (not suspended) now: calls now may feel it."""
        return self.mode if self.busy > 0 and not self._stopped else None

    @property
    def running(self) -> bool:
        """Whether a compile is running, read without the lock: a compile that starts during
        a call this read let pass costs that call one yield, not its correctness."""
        return self.busy > 0

    @property
    def has_work(self) -> bool:
        """A compile queued or running, read without the lock, as ``running``: a gate's read
        that misses a compile queued meanwhile is followed by that compile's wake."""
        return self.busy > 0 or bool(self._heap)

    @property
    def can_yield(self) -> bool:
        """Only worker processes can be suspended; a compiling thread runs on regardless."""
        return self.mode == "process"

    @contextmanager
    def yielding(self) -> Iterator[None]:
        """Suspend running compile processes for the duration of a heavy call; nestable.

        On two cores a compile on the second core still slows a call that wants both, so the
        compile gets the idle time between calls rather than a share of each one.
        """
        # Entered inside the try: an interrupt landing mid-entry must not leave the pool
        # held for good (``leave_yield`` floors the count at zero).
        try:
            self.enter_yield()
            yield
        finally:
            self.leave_yield()

    def enter_yield(self) -> None:
        """Suspend running compile processes, and start none, until ``leave_yield``; nestable."""
        with self._cv:
            self._yielding += 1
            if self._yielding > 1 or not self.can_yield or self.busy == 0:
                return
            self._stopped = self._signal_workers(signal.SIGSTOP)
            if self._stopped:
                self.yields += 1
                self._yield_started = time.perf_counter()

    def leave_yield(self) -> None:
        with self._cv:
            self._yielding = max(0, self._yielding - 1)
            if self._yielding:
                return
            self._notify_queued_locked()
            if self._stopped:
                self._resume_stopped()

    def _resume_stopped(self) -> None:
        for pid in self._stopped:
            try:
                os.kill(pid, signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass
        self._stopped = []
        self.yield_s += time.perf_counter() - self._yield_started

    def _signal_workers(self, sig: signal.Signals) -> list[int]:
        sent: list[int] = []
        if self._executor is None:
            return sent
        for proc in workers.processes(self._executor):
            if proc.pid is None:
                continue
            # A worker still starting has nothing to yield yet, and stopped before its
            # guard is set, it would outlive a parent that dies meanwhile.
            if sig == signal.SIGSTOP and not workers.guarded(proc.pid):
                continue
            try:
                os.kill(proc.pid, sig)
            except (ProcessLookupError, PermissionError):
                continue
            sent.append(proc.pid)
        return sent

    def add_feeder(self, settle: Callable[[], None]) -> None:
        """``settle`` submits whatever compiles the calls made so far ask for."""
        with self._cv:
            self._feeders.append(settle)

    def idle(self, settle: bool = True) -> bool:
        """No compile queued or running; by default after the feeders have submitted what the
        calls made so far ask for (not on the bookkeeping path, which is a feeder itself)."""
        if settle:
            with self._cv:
                feeders = list(self._feeders)
            for feed in feeders:
                feed()
        with self._cv:
            return not self._heap and self.busy == 0

    def wait_quiet(self, timeout_s: float) -> bool:
        """Whether no compile runs (each one's result delivered) within ``timeout_s``; paused,
        the queued ones then stay queued."""
        deadline = time.monotonic() + timeout_s
        with self._cv:
            while self.busy:
                left_s = deadline - time.monotonic()
                if left_s <= 0.0:
                    return False
                # Polled: a worker notifies only what may start next when it finishes.
                self._cv.wait(min(left_s, QUIET_POLL_S))
            return True

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
                while not self._closed and (
                    not self._heap
                    or self._paused
                    or self._yielding
                    or self._held_by_abandoned_locked()
                    or self._solo
                    or (self._heap[0].alone and self.busy > 0)
                ):
                    # Polled while abandoned compiles run: nothing signals their end; and
                    # while the trial waits to see whether compiles have run dry.
                    polled = self._abandoned or self._thread_trial_locked()
                    retire_in = self._retire_in_locked()
                    if retire_in is not None and retire_in <= 0.0:
                        self._retire_locked()
                        retire_in = None
                    waits = [w for w in (ABANDONED_POLL_S if polled else None, retire_in) if w]
                    self._cv.wait(min(waits) if waits else None)
                    slow = self._trial_ran_dry_locked()
                    if slow is not None:
                        try:
                            self._choose_locked(slow)
                        except Exception:  # a failed switch keeps the current mode
                            log.exception("JIT: switching the compile mode failed")
                if self._closed:
                    return
                if self._auto and not self.choice and self.busy == 0:
                    try:
                        self._trial_step_locked()
                    except Exception:  # a failed switch keeps the current mode
                        log.exception("JIT: switching the compile mode failed")
                job = heapq.heappop(self._heap)
                executor = self._executor_locked()
                self.busy += 1
                self._solo = job.alone
            requeued = False
            try:
                requeued = self._run(job, executor)
            except Exception:  # a broken callback must not end this worker
                log.exception("JIT: finishing the compile of %s %s failed", job.model, job.key)
            finally:
                with self._cv:
                    self.busy -= 1
                    if job.alone:
                        self._solo = False
                        self._cv.notify_all()
                    if requeued:
                        heapq.heappush(self._heap, job)
                        self._cv.notify()
                    else:
                        self._pending.discard((job.model, job.key))
                    self._last_done = time.monotonic()
                    ran_dry = not self._heap and self.busy == 0
                    wakers = list(self._wakers)
            if ran_dry:
                for wake in wakers:
                    wake()

    def _await(self, future: cf.Future[CompileResult]) -> CompileResult | None:
        """The compile's result; None if the pool closed meanwhile. Time its worker spent
        stopped through heavy calls does not count against the timeout: a compile stretched
        by yielding is not a hung one."""
        started = time.perf_counter()
        stopped_before = self._stopped_so_far()
        while True:
            running_s = time.perf_counter() - started - (self._stopped_so_far() - stopped_before)
            left_s = self._timeout_s - running_s
            if left_s <= 0.0:
                raise _CompileTimeout
            done, _ = cf.wait([future], timeout=min(left_s, AWAIT_POLL_S))
            if done:
                return future.result()
            if self._closed:
                return None

    def _run(self, job: CompileJob, executor: cf.Executor) -> bool:
        """Compile ``job`` on ``executor`` and report it; True if it is to be queued again,
        since another job's timeout or crash replaced the workers it ran on."""
        started = time.perf_counter()
        # Only the trial's process compiles need their stopped time; the mode cannot change
        # while this job runs.
        measuring = self._auto and not self.choice and self.mode == "process"
        stopped_before = self._stopped_so_far() if measuring else 0.0
        reason = ""
        # Workers to replace: a hung compile's (it may never return) or a crashed one's.
        restart = hung = False
        result: CompileResult | None = None
        try:
            # A worker started for this job imports the compiler first: not the job's time.
            self.wait_started(self._timeout_s)
            error = self._start_error()
            if error is not None:
                # A broken install: every compile on it fails, each a strike.
                raise CompileError(f"the compile worker failed to start: {error}")
            future = executor.submit(self._compile_fn, job.request, self._weights[job.model])
            # A pool of several spawns its later workers with its jobs, not at start.
            for proc in workers.processes(executor):
                if proc.pid is not None:
                    workers.lower_priority(proc.pid)
            result = self._await(future)
            if result is None:
                return False
        except _CompileTimeout:
            reason, restart, hung = "timeout", True, True
        except cf.BrokenExecutor as err:
            # A crashed worker breaks its pool for good, and the next compile gets a new one.
            # Alone in the pool, the crash is this key's strike; beside others, it cannot be
            # told whose it was, so each job it broke runs again alone.
            reason, restart = f"worker crashed: {err}", True
            if self._size > 1 and not job.alone:
                self._restart_executor(executor, hung=False)
                job.alone = True
                return not self._closed
        except Exception as err:  # noqa: BLE001 - any compile failure is a strike, not a crash
            reason = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        if reason and self._replaced(executor):
            # Not its failure: its workers were ended for another job's timeout, or closing.
            return not self._closed
        if restart:
            self._restart_executor(executor, hung)
        if result is None:
            job.on_done(job.key, None, time.perf_counter() - started, reason)
            return False
        if measuring:
            stopped = self._stopped_so_far() - stopped_before
            with self._cv:
                self._trial_wall_s += time.perf_counter() - started
                self._trial_stopped_s += stopped
        job.on_done(job.key, result, result.compile_s, "")
        return False

    def _replaced(self, executor: cf.Executor) -> bool:
        with self._cv:
            return self._closed or executor is not self._executor

    def _trial_step_locked(self) -> None:
        """Advance the auto trial between jobs: measure process, then thread, then choose."""
        if self.meter.samples(self.mode) < TRIAL_SAMPLES:
            return
        if self.mode == "process" and self.meter.samples("thread") == 0:
            self._replace_executor("thread")
            return
        slow = self._measured()
        if slow is not None:
            self._choose_locked(slow)

    def _measured(self) -> dict[str, float] | None:
        """Each mode's slowdown of live calls, once the meter has measured both."""
        process, thread = self.meter.slowdown("process"), self.meter.slowdown("thread")
        if process is None or thread is None:
            return None
        return {"process": process, "thread": thread}

    def _choose_locked(self, slow: Mapping[str, float]) -> None:
        running = self._trial_wall_s - self._trial_stopped_s
        stretch = self._trial_wall_s / running if running > 0 else None
        chosen = choose_mode(slow, stretch)
        self.choice = {
            "mode": chosen,
            "slowdown": {m: round(v, 4) for m, v in slow.items()},
            "process_stretch": None if stretch is None else round(stretch, 3),
        }
        log.info("JIT compile mode: %s (%s)", chosen, self.choice)
        if chosen != self.mode:
            self._replace_executor(chosen)

    def _thread_trial_locked(self) -> bool:
        return self._auto and not self.choice and self.mode == "thread" and self.busy == 0

    def _trial_ran_dry_locked(self) -> dict[str, float] | None:
        """Both modes' slowdowns, if the trial's thread phase, short of ``TRIAL_SAMPLES``, has
        waited ``TRIAL_DRY_S`` for a compile with both measured. Compiles run dry once the
        cost model learns what does not pay; rather than keep the mode tried second with no
        verdict behind it, the trial then chooses on what it has."""
        if not self._thread_trial_locked() or self._heap:
            return None
        if time.monotonic() - self._last_done < TRIAL_DRY_S:
            return None
        return self._measured()

    def _stopped_so_far(self) -> float:
        """Seconds the workers have spent stopped, including a stop still under way."""
        with self._cv:
            ongoing = time.perf_counter() - self._yield_started if self._stopped else 0.0
            return self.yield_s + ongoing

    def _restart_executor(self, executor: cf.Executor, hung: bool) -> None:
        """A timed-out compile may never return, a crashed worker breaks its pool: replace
        the workers, unless another job already has. A thread that hangs cannot be ended,
        and while it runs it holds a worker and keeps the interpreter from exiting cleanly:
        the auto mode takes processes from then on."""
        with self._cv:
            if self._closed or executor is not self._executor:
                return
            if self._stopped:
                self._resume_stopped()
            mode = self.mode
            if self._auto and mode == "thread" and hung:
                mode = "process"
                self.choice = {"mode": mode, "reason": "a compile thread hung"}
                log.warning("JIT: a compile thread hung; compiling in processes from now on")
            try:
                self._replace_executor(mode)
            except Exception:  # the next compile finds the pool broken: a strike
                log.exception("JIT: restarting the compile workers failed")

    def shutdown(self, wait: bool = True) -> None:
        with self._cv:
            self._closed = True
            self._heap.clear()
            # A stopped worker would ignore the terminate below until continued.
            if self._stopped:
                self._resume_stopped()
            self._cv.notify_all()
        for worker in self._workers:
            worker.join(timeout=5.0 if wait else 0.0)
        with self._cv:
            executor = self._executor
        if executor is not None:
            workers.terminate_processes(executor)
            executor.shutdown(wait=wait, cancel_futures=True)


def choose_mode(slowdown: Mapping[str, float], process_stretch: float | None) -> str:
    """The compile mode to keep after the trial.

    The mode that slows live calls less by more than ``TRIAL_MARGIN`` wins. Otherwise,
    threads if a process's compiles were stretched ``TRIAL_STRETCH``-fold by being stopped
    through heavy calls (so each lands later, and more calls run while one is pending);
    process takes what is left, since it keeps a crash in the worker. Without a successful
    process compile, the stretch is unknown.
    """
    if slowdown["thread"] + TRIAL_MARGIN < slowdown["process"]:
        return "thread"
    if slowdown["thread"] > slowdown["process"] + TRIAL_MARGIN:
        return "process"
    if process_stretch is not None and process_stretch >= TRIAL_STRETCH:
        return "thread"
    return "process"
