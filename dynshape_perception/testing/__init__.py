"""The harness that starts nodes and probes topics, for the demo and the integration tests."""

from __future__ import annotations

import importlib.metadata
import os


def launch_stack_required() -> bool:
    """Whether a missing launch stack fails a test rather than skipping it: in CI on the
    Kilted wheels, beside which ``make test`` installs it. The Jazzy wheels have none."""
    if os.environ.get("CI") != "true":
        return False
    try:
        importlib.metadata.distribution("ros-jazzy-rclpy")
    except importlib.metadata.PackageNotFoundError:
        return True
    return False
