"""What the nodes need from rclpy works on Humble's API too: parameters checked, then applied."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import rclpy
from rcl_interfaces.msg import SetParametersResult
from rclpy.context import Context
from rclpy.node import Node
from rclpy.parameter import Parameter

from dynshape_perception.nodes.base import on_parameters

pytestmark = pytest.mark.ros


class HumbleApiNode(Node):
    """A node as rclpy before Iron offers it: no post-set parameter callback."""

    # None where Iron's Node has a method: deliberately not the base class's type.
    add_post_set_parameters_callback = None  # type: ignore[assignment]


@pytest.fixture
def context() -> Iterator[Context]:
    ctx = Context()
    rclpy.init(args=[], context=ctx)
    yield ctx
    rclpy.try_shutdown(context=ctx)


@pytest.mark.parametrize("kind", [Node, HumbleApiNode], ids=["post-set", "on-set-only"])
def test_a_change_is_applied_once_accepted_and_never_when_refused(
    context: Context, kind: type[Node]
) -> None:
    node = kind("compat_test", context=context)
    try:
        node.declare_parameter("rate_hz", 10.0)
        applied: list[float] = []

        def check(changes: list[Parameter]) -> SetParametersResult:
            ok = all(p.value > 0.0 for p in changes)
            return SetParametersResult(successful=ok, reason="" if ok else "must be > 0")

        on_parameters(node, check, lambda changes: applied.extend(p.value for p in changes))
        assert node.set_parameters([Parameter("rate_hz", value=20.0)])[0].successful
        refused = node.set_parameters([Parameter("rate_hz", value=-1.0)])[0]
        assert not refused.successful and refused.reason == "must be > 0"
        assert applied == [20.0]
        assert node.get_parameter("rate_hz").value == 20.0
    finally:
        node.destroy_node()
