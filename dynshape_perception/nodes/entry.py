"""The nodes' console entry points: signal handling installed before any heavy import."""

from __future__ import annotations

import importlib
import logging
import os
import signal
import sys

from dynshape_perception.interrupts import StartupInterrupted, install_handlers


def run(module: str) -> int:
    """Install the handlers, then import and run ``dynshape_perception.nodes.<module>``."""
    install_handlers()
    try:
        node_main = importlib.import_module(f"dynshape_perception.nodes.{module}").main
        return int(node_main())
    except StartupInterrupted as stop:
        print(f"{module}: {signal.Signals(stop.args[0]).name} during start-up: exiting", flush=True)
    # A generic build may still run on its helper thread inside TVM (runtime/engine.py);
    # interpreter finalisation would tear that thread down mid-call. Everything the node
    # started was closed while the interruption unwound.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def pointcloud_node() -> int:
    return run("pointcloud_node")


def tracker_node() -> int:
    return run("tracker_node")


def prediction_node() -> int:
    return run("prediction_node")


def perception_pipeline() -> int:
    return run("perception_pipeline")
