"""Each node's stage times per frame, read from its ``~/debug/processing_time`` topics."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from rclpy.node import Node
from rclpy.qos import HistoryPolicy, QoSProfile, ReliabilityPolicy

from dynshape_perception.nodes.debug_times import TOTAL, message_type, topic_names
from dynshape_perception.testing.probe import SideReader

DEPTH = 100
SPIN_STEP_S = 0.05


class StageTimes:
    """Subscribes to the processing-time topics of each node's stages and keeps every value.

    The topics carry no stamp: a closed-loop client takes a frame's values as those that
    came in since its previous ``take`` (a sectored scan's stages add up per revolution).
    They are read by a ``SideReader``, spun only by ``spin_until``: each
    message would otherwise wake the probe while the frame it times is still in flight,
    and take a core from the nodes it measures. Until then they wait in the reader's history.
    """

    def __init__(self, probe: Node, stages: Mapping[str, Sequence[str]]) -> None:
        self.reader = SideReader(
            f"{probe.get_name()}_stage_times", probe.context, step_s=SPIN_STEP_S
        )
        self.stages = {node: tuple(names) for node, names in stages.items()}
        self._values: dict[tuple[str, str], list[float]] = {}
        self._taken: dict[tuple[str, str], int] = {}
        qos = QoSProfile(
            history=HistoryPolicy.KEEP_LAST, depth=DEPTH, reliability=ReliabilityPolicy.RELIABLE
        )
        msg_type = message_type()
        for node, names in self.stages.items():
            for stage in names:
                key = (node, stage)
                self._values[key] = []
                self._taken[key] = 0
                topic = "/" + node + topic_names(stage)[0][1:]
                self.reader.node.create_subscription(msg_type, topic, self._callback(key), qos)

    def _callback(self, key: tuple[str, str]) -> Any:
        values = self._values[key]

        def on_time(msg: Any) -> None:
            values.append(float(msg.data))

        return on_time

    def spin_until(self, condition: Callable[[], bool], timeout_s: float) -> bool:
        """Take in what came, until ``condition`` holds or ``timeout_s`` passed."""
        return self.reader.spin_until(condition, timeout_s)

    def close(self) -> None:
        self.reader.close()

    def publishing(self) -> list[str]:
        """The nodes whose whole-frame time has come in at least once."""
        return [n for n in self.stages if self._values.get((n, TOTAL))]

    def complete(self, nodes: Sequence[str], every_stage: bool = False) -> bool:
        """Whether each of ``nodes`` sent, since the last ``take``, its whole-frame time and
        every stage it has sent before (with ``every_stage``, every stage subscribed to). A
        node records its stages from more than one lane, the whole frame's not always last
        (``perception_pipeline`` records the lidar stages after its tracked objects, which
        may be after the prediction's total): waiting for the total alone would give a stage
        of this frame to the next. Before a stage has ever come in, only ``every_stage``
        waits for it, as a warm-up frame must: its late stages would be the next frame's."""
        return all(
            len(values) > self._taken[(node, stage)]
            for (node, stage), values in self._values.items()
            if node in nodes and (every_stage or stage == TOTAL or values)
        )

    def take(self) -> dict[str, dict[str, float]]:
        """Per node and stage, the sum of the values since the last ``take``; stages with
        none are left out."""
        frame: dict[str, dict[str, float]] = {}
        for (node, stage), values in self._values.items():
            new = values[self._taken[(node, stage)] :]
            self._taken[(node, stage)] = len(values)
            if new:
                frame.setdefault(node, {})[stage] = sum(new)
        return frame
