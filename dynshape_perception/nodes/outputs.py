"""Reliable publishers whose rate and stamps the node's diagnostics check."""

from __future__ import annotations

from typing import Any

from rclpy.event_handler import PublisherEventCallbacks
from rclpy.node import Node
from rclpy.publisher import Publisher
from rclpy.qos import QoSProfile

from dynshape_perception.nodes.diagnostics import NodeDiagnostics
from dynshape_perception.nodes.messages import stamp_s


def quiet_publisher(node: Node, msg_type: Any, topic: str, qos: QoSProfile) -> Publisher[Any]:
    """A publisher without rclpy's default QoS event handlers.

    rclpy gives every publisher two (incompatible QoS, incompatible type), and the executor
    rebuilds its wait set over every handler of the node at each wake-up, holding the GIL
    the lanes need. A subscriber that asks for incompatible QoS warns in its own log.
    """
    callbacks = PublisherEventCallbacks(use_default_callbacks=False)
    return node.create_publisher(msg_type, topic, qos, event_callbacks=callbacks)


class Output:
    """A reliable publisher whose rate (and stamps, if ``stamped``) the diagnostics check."""

    def __init__(
        self,
        node: Node,
        diagnostics: NodeDiagnostics,
        qos: QoSProfile,
        msg_type: Any,
        topic: str,
        stamped: bool,
    ) -> None:
        self.publisher = quiet_publisher(node, msg_type, topic, qos)
        self.name = self.publisher.topic_name
        self.stamped = stamped
        self.diagnostics = diagnostics
        self.diagnostics.topic(self.name, stamped)

    def publish(self, msg: Any) -> None:
        self.publisher.publish(msg)
        self.diagnostics.tick(self.name, stamp_s(msg.header.stamp) if self.stamped else None)

    def publish_serialized(self, data: bytes, stamp: Any) -> None:
        """A message already in CDR bytes, of header stamp ``stamp``."""
        self.publisher.publish(data)
        self.diagnostics.tick(self.name, stamp_s(stamp) if self.stamped else None)

    def unread(self) -> bool:
        """Nobody subscribes: an optional output need not be built. Its rate check counts
        the frame as served, since leaving it out is the node's choice, not a stall."""
        if self.publisher.get_subscription_count() > 0:
            return False
        self.diagnostics.tick(self.name)
        return True
