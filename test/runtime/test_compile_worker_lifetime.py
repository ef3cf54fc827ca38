"""Compile workers start with the first compile (or lean, ahead of it) and exit after
``idle_exit_s`` without one."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest

from dynshape_perception.models import model_definition
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import init_weights
from dynshape_perception.runtime.compile_pool import CompilePool
from dynshape_perception.runtime.process_tree import tree_usage
from dynshape_perception.runtime.shapes import Signature, sample_inputs
from dynshape_perception.runtime.validation import CompileRequest, CompileResult
from dynshape_perception.testing.faults import failing_compiler_fault_injector
from dynshape_perception.testing.workers import maps_tvm

ASSOC = model_definition("associator")
WEIGHTS = {"associator": init_weights(parameter_shapes(ASSOC), seed=8)}
IDLE_EXIT_S = 1.0
# Bounds on a hang, not timings: a worker imports TVM in minutes on a host loaded many times over.
WORKER_START_S = 600.0
EXIT_WAIT_S = 60.0


def request(key: Signature, cache_root: Path) -> CompileRequest:
    sample = sample_inputs(ASSOC, key.function, key.as_dict(), seed=1)
    return CompileRequest("associator", "x86_64", key, str(cache_root), sample=sample)


def compile_once(pool: CompilePool, key: Signature, cache_root: Path) -> str:
    done = threading.Event()
    reasons: list[str] = []

    def on_done(_key: Signature, _result: CompileResult | None, _s: float, reason: str) -> None:
        reasons.append(reason)
        done.set()

    assert pool.submit(request(key, cache_root), 1.0, on_done)
    assert done.wait(WORKER_START_S), "the compile never finished"
    return reasons[0]


def children() -> list[int]:
    """This process's descendants but multiprocessing's resource tracker, which is shared by
    every pool of the process and stays (a few MB)."""
    found = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if "resource_tracker" not in " ".join(proc.cmdline()):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


def idle_exit_pool(cache_root: Path) -> CompilePool:
    """Process workers whose compiles fail at once, exiting after ``IDLE_EXIT_S`` idle."""
    return CompilePool(
        WEIGHTS,
        "x86_64",
        cache_root,
        mode="process",
        compile_fn=failing_compiler_fault_injector,
        idle_exit_s=IDLE_EXIT_S,
    )


def test_workers_start_with_the_first_compile_and_exit_when_idle(
    tmp_path: Path, wait_gone: Callable[[list[int], float], list[int]]
) -> None:
    pool = idle_exit_pool(tmp_path)
    try:
        time.sleep(IDLE_EXIT_S)
        assert pool.worker_pids() == [] and pool.worker_starts == 0, "no compile, no worker"
        before = set(children())
        reason = compile_once(pool, Signature.of("forward", {"N": 4, "M": 4}), tmp_path)
        assert "injected" in reason, reason
        assert pool.worker_starts == 1
        workers = [p for p in children() if p not in before]
        assert workers, "the compile ran in a worker process"
        assert wait_gone(workers, EXIT_WAIT_S) == [], "idle workers must exit"
        assert pool.worker_pids() == [] and pool.worker_exits == 1
        # The next compile starts them again.
        compile_once(pool, Signature.of("forward", {"N": 5, "M": 4}), tmp_path)
        assert pool.worker_starts == 2
    finally:
        pool.shutdown()


def test_with_no_idle_exit_the_workers_stay(
    tmp_path: Path, wait_gone: Callable[[list[int], float], list[int]]
) -> None:
    pool = CompilePool(
        WEIGHTS, "x86_64", tmp_path, mode="process", compile_fn=failing_compiler_fault_injector
    )
    try:
        compile_once(pool, Signature.of("forward", {"N": 4, "M": 4}), tmp_path)
        (pid,) = pool.worker_pids()
        time.sleep(3 * IDLE_EXIT_S)
        assert pool.worker_pids() == [pid] and pool.worker_exits == 0
        usage = tree_usage()
        assert usage.processes >= 2 and usage.rss_bytes > psutil.Process(pid).memory_info().rss
    finally:
        pool.shutdown()
    assert wait_gone([pid], EXIT_WAIT_S) == []


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/PID/maps: Linux")
def test_a_lean_start_stays_while_idle_and_comes_back_lean_after_its_compiles(
    tmp_path: Path, wait_gone: Callable[[list[int], float], list[int]]
) -> None:
    """A lean worker holds no compiler, so idling frees nothing: it stays. One that has
    compiled retires when idle, and a lean one takes its place, so that the next compile
    spawns nothing in the middle of serving."""
    pool = idle_exit_pool(tmp_path)
    try:
        pool.start_lean()
        (lean,) = pool.worker_pids()
        time.sleep(3 * IDLE_EXIT_S)
        assert pool.worker_pids() == [lean] and pool.worker_exits == 0
        assert not maps_tvm(lean)
        reason = compile_once(pool, Signature.of("forward", {"N": 4, "M": 4}), tmp_path)
        assert "injected" in reason, reason
        assert pool.worker_starts == 1 and maps_tvm(lean), "compiled on the lean one"
        left = wait_gone([lean], EXIT_WAIT_S)
        assert left == [], "a worker that imported the compiler exits when idle"
        deadline = time.monotonic() + EXIT_WAIT_S
        while pool.worker_starts < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert pool.worker_exits == 1 and pool.worker_starts == 2
        (fresh,) = pool.worker_pids()
        assert fresh != lean and not maps_tvm(fresh)
        compile_once(pool, Signature.of("forward", {"N": 5, "M": 4}), tmp_path)
        assert pool.worker_starts == 2 and pool.worker_pids() == [fresh]
    finally:
        pool.shutdown()
