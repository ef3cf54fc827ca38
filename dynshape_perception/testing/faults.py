"""Fault injectors for the compile pool: compilers and worker starts that stall, crash or fail."""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Mapping

import numpy as np

from dynshape_perception.errors import CompileError
from dynshape_perception.runtime.bookkeeper import Bookkeeper, Settle
from dynshape_perception.runtime.compile_workers import compile_to_cache
from dynshape_perception.runtime.validation import CompileRequest, CompileResult

STALL_S = 3.0


def stalling_compiler_fault_injector(
    request: CompileRequest, weights: Mapping[str, np.ndarray]
) -> CompileResult:
    """Fault injector: a compile that burns a core for ``STALL_S``, then fails."""
    until = time.monotonic() + STALL_S
    while time.monotonic() < until:
        pass
    raise CompileError(f"injected stall for {request.model} {request.key}")


def crashing_compiler_fault_injector(
    request: CompileRequest, weights: Mapping[str, np.ndarray]
) -> CompileResult:
    """Fault injector: a compiler that crashes its process (as LLVM or a TVM FFI mismatch can)
    for keys whose first dim is odd, and compiles the others."""
    if request.key.dims[0][1] % 2:
        os.kill(os.getpid(), signal.SIGSEGV)
    return compile_to_cache(request, weights)


def slow_or_crashing_compiler_fault_injector(
    request: CompileRequest, weights: Mapping[str, np.ndarray]
) -> CompileResult:
    """Fault injector: for keys whose first dim is odd, a compiler that crashes its process
    at once; for the others, one that fails after 3 s, so that a crash lands mid-compile."""
    if request.key.dims[0][1] % 2:
        os.kill(os.getpid(), signal.SIGSEGV)
    time.sleep(3.0)
    raise CompileError(f"injected slow failure for {request.model} {request.key}")


def failing_worker_start_fault_injector() -> None:
    """Fault injector: a worker process whose start fails (a broken install), as the pool's
    initialiser in place of ``start_worker``."""
    raise CompileError("injected failure of the compile worker's start")


def failing_compiler_fault_injector(
    request: CompileRequest, weights: Mapping[str, np.ndarray]
) -> CompileResult:
    """Fault injector for tests and drills: every compile fails like a broken toolchain."""
    raise CompileError(f"injected compile failure for {request.model} {request.key}")


class StalledBookkeeperFaultInjector(Bookkeeper):
    """Fault injector: a bookkeeper whose thread never settles anything, rung or not."""

    def __init__(self) -> None:
        super().__init__(poll_s=3600.0, name="jit-bookkeeper-stalled")

    def add(self, settle: Settle) -> None:
        pass

    def ring(self, settle: Settle) -> None:
        pass
