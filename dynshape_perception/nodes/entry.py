"""The nodes' console entry points: signal handling installed before any heavy import."""

from __future__ import annotations

import ctypes
import faulthandler
import importlib
import logging
import os
import signal
import sys
from typing import NoReturn

from dynshape_perception.interrupts import STACKS_SIGNAL, install_handlers, requested
from dynshape_perception.runtime.lean_imports import keep_unused_out


def run(module: str) -> int:
    """Install the handlers, then import and run ``dynshape_perception.nodes.<module>``."""
    # Inside the try from the first handler on: a signal may interrupt the next line.
    try:
        install_handlers()
        # At C level, so it answers while the main thread waits in DDS or holds the GIL in C
        # code: the one way to see where a node that does not stop is stuck.
        faulthandler.register(STACKS_SIGNAL, all_threads=True)
        keep_unused_out()
        node_main = importlib.import_module(f"dynshape_perception.nodes.{module}").main
        # After the import: loading tvm_ffi installs its own SIGSEGV handler, which prints
        # only native frames and would replace this one. This one writes every thread's
        # Python stack, then hands the signal on to it.
        faulthandler.enable(all_threads=True)
        code = int(node_main())
    except BaseException:
        # StartupInterrupted, or what C code under it (numpy's import of datetime, a TVM
        # callback) turned it into: a requested exit either way.
        if requested() is None:
            raise
    else:
        if requested() is None:
            # The node has closed all it started and left the graph. Interpreter
            # finalisation would add only waits and teardown: joins of threads a native
            # call may hold, and TVM's and Fast DDS's static destructors running beside
            # daemon threads still inside them, where a stall or crash hangs the exit.
            leave(code)
    stop = signal.Signals(requested() or signal.SIGTERM).name
    print(f"{module}: {stop} during start-up: exiting", flush=True)
    # A generic build may still run on its helper thread inside TVM (runtime/engine.py);
    # interpreter finalisation would tear that thread down mid-call. Everything the node
    # started was closed while the interruption unwound.
    leave(0)


def leave(code: int) -> NoReturn:
    """Exit with ``code`` once the logs are out, without the interpreter's finalisation."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    # C's streams too: ROS logging may write to a buffered stdout (RCUTILS_LOGGING_USE_STDOUT).
    try:
        ctypes.CDLL(None).fflush(None)
    except OSError:
        pass
    os._exit(code)


def pointcloud_node() -> int:
    return run("pointcloud_node")


def tracker_node() -> int:
    return run("tracker_node")


def prediction_node() -> int:
    return run("prediction_node")


def perception_pipeline() -> int:
    return run("perception_pipeline")
