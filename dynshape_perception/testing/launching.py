"""launch_testing of the package's launch files: a private domain, a scan through, exits checked."""

from __future__ import annotations

import sys
import threading
import time
import unittest
from collections.abc import Mapping
from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np
from launch.actions import IncludeLaunchDescription, RegisterEventHandler, SetEnvironmentVariable
from launch.event_handlers import OnProcessExit, OnProcessStart, OnShutdown
from launch.events.process import ProcessExited, ProcessStarted
from launch.launch_context import LaunchContext
from launch.launch_description import LaunchDescription
from launch.launch_description_sources import AnyLaunchDescriptionSource
from launch.substitutions import PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare
from launch_testing.actions import ReadyToTest

from dynshape_perception.errors import ConfigError
from dynshape_perception.interrupts import STACKS_SIGNAL
from dynshape_perception.io.datasets import read_kitti_bin
from dynshape_perception.perception.transforms import planar
from dynshape_perception.resources import PACKAGE, shared_data_dir
from dynshape_perception.testing.probe import Probe, Received, probe_session
from dynshape_perception.testing.processes import (
    catches,
    dds_settings,
    domain_lease,
    dump_stacks,
    thread_states,
)

DETECTED, TRACKED, PREDICTED = "detected_objects", "tracked_objects", "predicted_objects"
STEP_NS = 100_000_000
SPEED_MPS = 2.0
MOUNT_HEIGHT_M = 1.73
# Scans sent, the first of which may wait for the models to build (or load from the cache).
FRAMES = 6
STARTUP_S = 600.0
FRAME_S = 30.0
# Launch sends SIGTERM 5 s after SIGINT and then kills: a node still running before that
# is asked for its stacks, the one record of where it is stuck.
STACKS_AFTER_S = 4.0
# Domains leased by this process; their locks go when it exits.
_LEASES = ExitStack()


def scan() -> np.ndarray:
    """The real KITTI scan where ../shared/data is, else cars and a wall on flat ground."""
    shared = shared_data_dir()
    if shared is not None:
        return read_kitti_bin(shared / "lidar" / "kitti_000008.bin")
    rng = np.random.default_rng(0)
    ground = np.c_[rng.uniform(2, 40, 20_000), rng.uniform(-15, 15, 20_000), np.zeros(20_000)]
    boxes = []
    for x, y, (length, width, height) in (
        (10.0, 3.0, (4.2, 1.8, 1.5)),
        (18.0, -4.0, (4.5, 1.9, 1.6)),
        (25.0, 8.0, (10.0, 0.3, 2.5)),
    ):
        corner = rng.uniform(0.0, 1.0, (2_000, 3)) * (length, width, height)
        boxes.append(corner + np.array([x - length / 2, y - width / 2, 0.0]))
    xyz = np.concatenate([ground, *boxes]) - (0.0, 0.0, MOUNT_HEIGHT_M)
    return np.c_[xyz, rng.uniform(0.0, 1.0, xyz.shape[0])].astype(np.float32)


def launch_description(
    launch_file: str, arguments: Mapping[str, str]
) -> tuple[LaunchDescription, dict[str, object]]:
    """The package's ``launch/<launch_file>`` (found through the ament index, as ``ros2 launch``
    finds it) on a domain of its own, then ReadyToTest; the context holds the domain."""
    domain = _LEASES.enter_context(domain_lease())
    env = {**dds_settings(), "ROS_DOMAIN_ID": str(domain)}
    path = PathJoinSubstitution([FindPackageShare(PACKAGE), "launch", launch_file])
    return LaunchDescription(
        [
            *(SetEnvironmentVariable(key, value) for key, value in env.items()),
            *StackWatch().handlers(),
            IncludeLaunchDescription(
                AnyLaunchDescriptionSource(path), launch_arguments=list(arguments.items())
            ),
            ReadyToTest(),
        ]
    ), {"domain": domain}


class StackWatch:
    """The launched processes; those still running ``STACKS_AFTER_S`` after the launch
    shuts down write their stacks to their output, which the test prints."""

    def __init__(self) -> None:
        self._running: set[int] = set()
        self._lock = threading.Lock()
        self._timer: threading.Timer | None = None

    def handlers(self) -> list[RegisterEventHandler]:
        return [
            RegisterEventHandler(OnProcessStart(on_start=self._started)),
            RegisterEventHandler(OnProcessExit(on_exit=self._exited)),
            RegisterEventHandler(OnShutdown(on_shutdown=self._shutdown)),
        ]

    def _started(self, event: ProcessStarted, context: LaunchContext) -> None:
        with self._lock:
            self._running.add(event.pid)

    def _exited(self, event: ProcessExited, context: LaunchContext) -> None:
        with self._lock:
            self._running.discard(event.pid)

    def _shutdown(self, event: object, context: LaunchContext) -> None:
        # Once: launch handles each Shutdown event emitted, and a test may emit several.
        with self._lock:
            if self._timer is not None:
                return
            self._timer = threading.Timer(STACKS_AFTER_S, self._dump)
            self._timer.daemon = True
            self._timer.start()

    def _dump(self) -> None:
        with self._lock:
            running = sorted(self._running)
        # Before the stacks, whose wait may outlast the process: launch's SIGTERM follows.
        for pid in running:
            threads = "\n  ".join(thread_states(pid))
            stacks = "stacks in its log" if catches(pid, STACKS_SIGNAL) else "no SIGUSR1 handler"
            print(f"pid {pid} still running ({stacks}); threads:\n  {threads}", file=sys.stderr)
        dump_stacks(running)

    def wait(self, timeout_s: float) -> None:
        """Until the watch has reported, if the launch has shut down."""
        with self._lock:
            timer = self._timer
        if timer is not None:
            timer.join(timeout_s)


@dataclass
class Outputs:
    """The standard outputs of one scan, and what /diagnostics said of each node."""

    stamp_ns: int
    received: dict[str, Received]
    nodes: set[str]


def drive_through(
    domain: int, points: np.ndarray, frames: int, startup_s: float, frame_s: float
) -> Outputs:
    """A client of the launched nodes: the lidar mount on /tf_static, the vehicle on /tf,
    ``frames`` scans; the outputs of the last one, which must carry tracks."""
    with probe_session(domain, name="launch_client") as probe:
        # Every output matched, not only the last: a reader matched late misses the first
        # scans' objects, and a fast start can answer them all before it is.
        outputs = {DETECTED: 1, TRACKED: 1, PREDICTED: 1}
        if not probe.wait_for_graph({"points": 1}, outputs, startup_s):
            raise ConfigError(f"the launched nodes were not up within {startup_s} s")
        mount = planar(z=MOUNT_HEIGHT_M)
        probe.publish_transforms([("base_link", "lidar", mount)], static=True)
        probe.spin_for(1.0)
        first_ns = ns = time.time_ns()
        sent: list[int] = []
        answered: list[int] = []

        def unanswered() -> list[int]:
            return [s for s in sent if s not in answered]

        def came() -> bool:
            return any(_has_every_output(probe.received, s) for s in unanswered())

        # The first scan may wait for the models to build. A scan unanswered after
        # ``frame_s`` is followed by the next, the first too: a best-effort cloud can be lost
        # whole (a reader matched late, a fragment dropped), and an answer that comes later
        # still counts.
        deadline = time.monotonic() + startup_s + frames * frame_s
        while len(answered) < frames:
            left_s = deadline - time.monotonic()
            if left_s <= 0.0:
                raise ConfigError(
                    f"{len(answered)} of {frames} scans answered in time; {_what_came(probe, sent)}"
                )
            ns += STEP_NS
            moved = planar(SPEED_MPS * (ns - first_ns) / 1e9)
            probe.publish_transforms([("odom", "base_link", moved)], ns=ns)
            probe.publish_points(points, ns, "lidar")
            sent.append(ns)
            if probe.spin_until(came, min(frame_s, left_s)):
                answered += [s for s in unanswered() if _has_every_output(probe.received, s)]
        probe.spin_for(2.0)
        last = answered[-1]
        received = {topic: probe.received[topic][last] for topic in (DETECTED, TRACKED, PREDICTED)}
        return Outputs(last, received, {name.lstrip("/") for name in probe.diagnostics})


def _has_every_output(received: Mapping[str, Mapping[int, Received]], ns: int) -> bool:
    return all(ns in received[topic] for topic in (DETECTED, TRACKED, PREDICTED))


def _what_came(probe: Probe, sent: list[int]) -> str:
    """Of the scans sent, how many each output answered, and what each node reported."""
    stamps = set(sent)
    outputs = ", ".join(
        f"{topic} {len(stamps & probe.received[topic].keys())}"
        for topic in (DETECTED, TRACKED, PREDICTED)
    )
    nodes = "; ".join(f"{name}: {diag.message}" for name, diag in sorted(probe.diagnostics.items()))
    return f"of {len(sent)} sent, answered by {outputs}; diagnostics: {nodes or 'none'}"


def check_outputs(case: unittest.TestCase, outputs: Outputs, nodes: set[str]) -> None:
    """Objects in the vehicle frame, tracks and predictions in the fixed one (from /tf),
    tracks with UUIDs, and a status from every node."""
    detected, tracked, predicted = (outputs.received[t] for t in (DETECTED, TRACKED, PREDICTED))
    case.assertEqual(detected.frame_id, "base_link")
    case.assertEqual((tracked.frame_id, predicted.frame_id), ("odom", "odom"))
    case.assertGreater(len(detected.msg.objects), 0)
    case.assertGreater(len(tracked.msg.objects), 0)
    uuids = {bytes(o.object_id.uuid) for o in tracked.msg.objects}
    case.assertEqual(len(uuids), len(tracked.msg.objects))
    case.assertEqual({bytes(o.object_id.uuid) for o in predicted.msg.objects}, uuids)
    case.assertTrue(nodes <= outputs.nodes, outputs.nodes)
