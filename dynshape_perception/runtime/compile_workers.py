"""Compile workers: the job a worker runs, its start and guards, and the executors' processes."""

from __future__ import annotations

import concurrent.futures as cf
import itertools
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Mapping
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from dynshape_perception.runtime.validation import CompileRequest, CompileResult, validate
from dynshape_perception.runtime.worker_life import init_worker, start_worker

__all__ = ["init_worker", "start_worker"]

if TYPE_CHECKING:
    from dynshape_perception.compiler.cache import Artefact, ArtefactCache
    from dynshape_perception.runtime.executable import LoadedModel


# Compiles run at lower CPU priority so that the frame loop keeps its cores.
WORKER_NICENESS = 10
# A compile thread still inside TVM when the interpreter exits aborts the process
# (std::terminate, exit status 134): closing waits this long for running compiles to return.
EXIT_WAIT_S = 30.0


# Per worker: the generic build each specialisation is validated against, loaded once.
_GENERIC: dict[tuple[str, str, str, str], LoadedModel] = {}


def compile_to_cache(request: CompileRequest, weights: Mapping[str, np.ndarray]) -> CompileResult:
    """Build (or fetch) a specialisation of one function into the artefact cache, then
    validate and time it against the generic build; runs in a worker.

    Building only the called entry point keeps compiles short and libraries small, and
    validating here keeps that work off the process whose threads serve calls.
    """
    from dynshape_perception.compiler.cache import ArtefactCache

    started = time.perf_counter()
    cache = ArtefactCache(Path(request.cache_root), request.cache_max_bytes)
    artefact = build_specialisation(request, weights, cache)
    compile_s = time.perf_counter() - started
    path = artefact.library_path
    speedup = validate_in_worker(request, weights, path)
    return CompileResult(str(path), compile_s, speedup, artefact.cache_hit, cache.evicted)


def build_specialisation(
    request: CompileRequest,
    weights: Mapping[str, np.ndarray],
    cache: ArtefactCache | None = None,
) -> Artefact:
    from dynshape_perception.compiler.cache import ArtefactCache
    from dynshape_perception.compiler.targets import load_profile
    from dynshape_perception.models import model_definition

    cache = cache or ArtefactCache(Path(request.cache_root), request.cache_max_bytes)
    return cache.get_or_build(
        model_definition(request.model),
        weights,
        load_profile(request.profile),
        request.key.as_dict(),
        (request.key.function,),
    )


def validate_in_worker(
    request: CompileRequest, weights: Mapping[str, np.ndarray], library: Path
) -> float:
    """Phase one against the generic build of ``weights``; returns specialised/generic time."""
    from dynshape_perception.compiler.cache import ArtefactCache
    from dynshape_perception.compiler.targets import load_profile
    from dynshape_perception.models import model_definition
    from dynshape_perception.models.weights import weights_checksum
    from dynshape_perception.runtime.executable import LoadedModel

    model = model_definition(request.model)
    slot = (request.model, request.profile, request.cache_root, weights_checksum(weights))
    if slot not in _GENERIC:
        cache = ArtefactCache(Path(request.cache_root), request.cache_max_bytes)
        generic = cache.get_or_build(model, weights, load_profile(request.profile))
        _GENERIC[slot] = LoadedModel(model, generic.library_path)
    special = LoadedModel(model, library, functions=(request.key.function,))
    return validate(model, _GENERIC[slot], special, request)


def ready() -> bool:
    return True


def lower_priority(pid: int) -> None:
    """SCHED_IDLE where the OS has it: a serving thread that wakes takes the core at once.
    On Linux ``pid`` may name a thread of this process, which alone is lowered.

    A nice-10 compile still holds a core until the scheduler's wake-up granularity passes,
    and a small TVM call whose parallel region needs that core waits for it.
    """
    try:
        os.setpriority(os.PRIO_PROCESS, pid, WORKER_NICENESS)
    except OSError:
        pass
    idle = getattr(os, "SCHED_IDLE", None)
    if idle is not None:
        try:
            os.sched_setscheduler(pid, idle, os.sched_param(0))
        except OSError:
            pass


class DaemonThreadExecutor(cf.Executor):
    """One daemon thread per compile, at idle priority on Linux.

    A Python thread cannot be stopped: a compile past its timeout is abandoned and runs on.
    ``ThreadPoolExecutor`` would join it at interpreter exit, so a hung compile would keep
    the process from exiting; a daemon thread does not. Closing waits for running compiles
    up to ``EXIT_WAIT_S``, since exiting beside one aborts the process.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._count = itertools.count()
        self.threads: list[threading.Thread] = []

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> cf.Future[Any]:
        future: cf.Future[Any] = cf.Future()

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            # As a worker process is: a compile thread at normal priority holds one of the
            # cores a parallel call (a point cloud) splits its work over, and threads cannot
            # be stopped through heavy calls as a process is.
            if sys.platform.startswith("linux"):
                lower_priority(threading.get_native_id())
            try:
                future.set_result(fn(*args, **kwargs))
            except BaseException as err:  # noqa: BLE001 - the waiting side re-raises it
                future.set_exception(err)

        thread = threading.Thread(target=run, name=f"{self._name}_{next(self._count)}", daemon=True)
        self.threads = [t for t in self.threads if t.is_alive()]
        self.threads.append(thread)
        thread.start()
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """With ``wait``, let running compiles return, for ``EXIT_WAIT_S`` at most; one that
        takes longer (hung) is abandoned."""
        if not wait:
            return
        deadline = time.monotonic() + EXIT_WAIT_S
        for thread in self.threads:
            thread.join(max(0.0, deadline - time.monotonic()))


def guarded(pid: int) -> bool:
    """Whether worker ``pid`` has set its parent-death guard (it leads its own group then)."""
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


def processes(executor: cf.Executor) -> list[BaseProcess]:
    """A process pool's worker processes (none for threads), copied: the pool's manager
    thread may change its table meanwhile."""
    return list(getattr(executor, "_processes", {}).values())


def terminate_processes(executor: cf.Executor) -> None:
    """A process pool's shutdown waits for a running job; a compile may never finish. A
    worker stopped through a heavy call holds SIGTERM until continued. Each worker leads
    its own process group: ending the group ends what it started (a compiler) too."""
    for proc in processes(executor):
        proc.terminate()
        if proc.pid is not None:
            try:
                os.kill(proc.pid, signal.SIGCONT)
            except (ProcessLookupError, PermissionError):
                pass
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
