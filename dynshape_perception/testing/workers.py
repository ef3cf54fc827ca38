"""Compile worker processes as the tests look at them (ROS-free)."""

from __future__ import annotations

from pathlib import Path


def maps_tvm(pid: int) -> bool:
    """Whether process ``pid`` has TVM's library mapped (Linux: ``/proc/<pid>/maps``)."""
    return "libtvm" in Path(f"/proc/{pid}/maps").read_text()
