"""``run_node``: a requested shutdown exits 0 however it reaches the node; a real fault does not."""

from __future__ import annotations

import time
from typing import Any

import pytest
import rclpy
from rclpy.executors import ExternalShutdownException

from dynshape_perception.nodes import base
from dynshape_perception.nodes.base import run_node

pytestmark = pytest.mark.ros


class ClosingNode:
    """Stands in for a PerceptionNode: run_node needs only ``start``, ``failure`` and
    ``close``."""

    def __init__(self) -> None:
        self.closed = False
        self.failure: BaseException | None = None

    def start(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def spin_racing_shutdown_fault_injector(node: Any) -> None:
    """Fault injector: a signal shuts the context down just before the executor builds its
    wait set, which rclpy then reports as an RCLError (a RuntimeError)."""
    rclpy.shutdown()
    raise RuntimeError("failed to initialize wait set: the given context is not valid")


def spin_failing_fault_injector(node: Any) -> None:
    """Fault injector: the executor fails while the context is still valid."""
    raise RuntimeError("a real executor fault")


def test_a_signal_racing_the_executor_is_a_clean_exit(monkeypatch: pytest.MonkeyPatch) -> None:
    node = ClosingNode()
    monkeypatch.setattr(rclpy, "spin", spin_racing_shutdown_fault_injector)
    assert run_node(lambda: node, args=[]) == 0  # type: ignore[arg-type, return-value]
    assert node.closed, "the node still stops its compile workers"


def test_an_executor_fault_with_the_context_valid_is_raised(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = ClosingNode()
    monkeypatch.setattr(rclpy, "spin", spin_failing_fault_injector)
    with pytest.raises(RuntimeError, match="real executor fault"):
        run_node(lambda: node, args=[])  # type: ignore[arg-type, return-value]
    assert node.closed


def test_a_failed_input_thread_is_raised_though_it_shut_the_context_down(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    node = ClosingNode()

    def spin_input_thread_failing_fault_injector(_: Any) -> None:
        """Fault injector: the input thread fails, shuts the context down to end the spin."""
        node.failure = RuntimeError("the input thread failed")
        rclpy.shutdown()
        raise ExternalShutdownException()

    monkeypatch.setattr(rclpy, "spin", spin_input_thread_failing_fault_injector)
    with pytest.raises(RuntimeError, match="input thread failed"):
        run_node(lambda: node, args=[])  # type: ignore[arg-type, return-value]
    assert node.closed


class SlowClosingNode(ClosingNode):
    def __init__(self, close_s: float) -> None:
        super().__init__()
        self.close_s = close_s

    def close(self) -> None:
        slow_close_fault_injector(self.close_s)
        super().close()


def slow_close_fault_injector(seconds: float) -> None:
    """Fault injector: a stop that waits in its close, as one stuck in DDS teardown does."""
    time.sleep(seconds)


def spin_stopped(node: Any) -> None:
    rclpy.shutdown()
    raise ExternalShutdownException()


def test_a_stop_that_takes_too_long_writes_every_threads_stack(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(base, "STOP_STACKS_S", 0.2)
    monkeypatch.setattr(rclpy, "spin", spin_stopped)
    node = SlowClosingNode(close_s=1.0)
    assert run_node(lambda: node, args=[]) == 0  # type: ignore[arg-type, return-value]
    said = capfd.readouterr().err
    assert "most recent call first" in said and "slow_close_fault_injector" in said, said


def test_a_prompt_stop_writes_no_stack(
    monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(base, "STOP_STACKS_S", 0.2)
    monkeypatch.setattr(rclpy, "spin", spin_stopped)
    assert run_node(lambda: ClosingNode(), args=[]) == 0  # type: ignore[arg-type, return-value]
    # Past the limit: the watch ended with the stop.
    time.sleep(0.6)
    assert "most recent call first" not in capfd.readouterr().err
