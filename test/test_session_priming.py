"""Priming a node session: frames until one comes through in the odometry's frame, bounded by
time however fast the nodes answer in the sensor's; a failure says what came back and what
the nodes logged of odometry."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dynshape_perception.errors import ConfigError
from dynshape_perception.perception.pipeline import Pose2D
from dynshape_perception.testing.probe import ODOM_FRAME, Received
from dynshape_perception.testing.session import (
    OUTPUTS,
    PREDICTED,
    STAMP_STEP_NS,
    FrameTiming,
    NodeSession,
)

pytestmark = pytest.mark.ros

FIRST_NS = 1_000_000_000
NODE_LOG = (
    "[INFO] [tracker_node]: static sensor assumed, tracking in the input frame 'base_link'\n"
    "[INFO] [tracker_node]: jit: generic build loaded\n"
)


@dataclass
class LoggedProcess:
    name: str
    text: str

    def log(self) -> str:
        return self.text

    def alive(self) -> bool:
        return True


class ProbeStandIn:
    def __init__(self) -> None:
        self.received: dict[str, dict[int, Received]] = {t: {} for t in OUTPUTS}
        self.paced = 0

    def spin_for(self, seconds: float) -> None:
        self.paced += 1


class LateOdometryFaultInjector(NodeSession):
    """Nodes that answer each scan at once, in the sensor's frame until they have taken
    ``sensor_frames`` of them, then in the odometry's; ``None`` for frames they lose."""

    def __init__(self, sensor_frames: float, lose: frozenset[int] = frozenset()) -> None:
        self.stand_in = ProbeStandIn()
        processes: Any = [LoggedProcess("tracker_node", NODE_LOG)]
        super().__init__("separate", 0, self.stand_in, processes, Path())  # type: ignore[arg-type]
        self.sensor_frames = sensor_frames
        self.lose = lose
        self.sent: list[int] = []
        self.waits_s: list[float] = []

    def frame(  # type: ignore[override]
        self, cloud: np.ndarray, stamp_ns: int, pose: Pose2D | None, timeout_s: float, wait_for: Any
    ) -> FrameTiming:
        k = len(self.sent)
        self.sent.append(stamp_ns)
        self.waits_s.append(timeout_s)
        if k not in self.lose:
            frame_id = "base_link" if k < self.sensor_frames else ODOM_FRAME
            self.probe.received[PREDICTED][stamp_ns] = Received(0.0, frame_id, None)
        return FrameTiming(stamp_ns)


CLOUD = np.zeros((1, 4), dtype=np.float32)


def test_priming_outlasts_many_fast_answers_in_the_sensor_frame() -> None:
    session = LateOdometryFaultInjector(sensor_frames=200, lose=frozenset({3}))
    stamp = session.prime(CLOUD, FIRST_NS, within_s=60.0, frame_timeout_s=10.0)
    assert len(session.sent) == 201
    assert session.sent == [FIRST_NS + k * STAMP_STEP_NS for k in range(201)]
    assert stamp == FIRST_NS + 201 * STAMP_STEP_NS
    # Paced as a sensor would be after each answered frame; a lost one was waited for.
    assert session.stand_in.paced == 199
    assert all(0.0 < w <= 10.0 for w in session.waits_s)


def test_priming_that_never_reaches_the_odometry_frame_says_what_came() -> None:
    session = LateOdometryFaultInjector(sensor_frames=float("inf"), lose=frozenset({0}))
    with pytest.raises(ConfigError) as caught:
        session.prime(CLOUD, FIRST_NS, within_s=0.2, frame_timeout_s=10.0)
    message = str(caught.value)
    assert f"no predictions in {ODOM_FRAME!r} came back within 0.2 s" in message
    assert re.search(r"\(of (\d+) frames: 1 lost, \d+ in 'base_link'\)", message), message
    # The node's own account of its frame, not its other lines.
    assert "static sensor assumed" in message and "generic build" not in message
    # However close the deadline, a frame gets a fair wait, and never more than asked.
    assert all(0.5 <= w <= 10.0 for w in session.waits_s)
