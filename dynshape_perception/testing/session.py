"""The nodes as processes on a private DDS domain, driven frame by frame (demo, bench, tests)."""

from __future__ import annotations

import signal
import tempfile
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dynshape_perception.errors import ConfigError
from dynshape_perception.io.pointcloud2 import CloudData, points_to_cloud
from dynshape_perception.perception.pipeline import Pose2D
from dynshape_perception.resources import config_path
from dynshape_perception.testing.probe import OBJECT_TOPICS, ODOM_FRAME, Probe, probe_session
from dynshape_perception.testing.processes import (
    NodeProcess,
    dds_env,
    dds_settings_applied,
    domain_lease,
    start_node,
)

SEPARATE = ("pointcloud_node", "tracker_node", "prediction_node")
COMPOSED = ("perception_pipeline",)
MODES = {"separate": SEPARATE, "composed": COMPOSED}
# Subscribers and publishers each topic has once the nodes are up; the probe subscribes
# to every output and publishes points, odom and detected objects itself.
READY_SUBSCRIBERS = {
    "separate": {"points": 1, "detected_objects": 2, "tracked_objects": 2, "odom": 2},
    "composed": {"points": 1, "odom": 1},
}
READY_PUBLISHERS = {
    "detected_objects": 2,
    "tracked_objects": 1,
    "predicted_objects": 1,
    "markers": 1,
}
STAMP_STEP_NS = 100_000_000
# The standard outputs, by stage: detection, tracking, prediction; and the markers.
DETECTED, TRACKED, PREDICTED = "detected_objects", "tracked_objects", "predicted_objects"
OUTPUTS = (DETECTED, TRACKED, PREDICTED, "markers")
# How long the deferred outputs of a frame whose awaited ones came may still take: they were
# published first, so they are already in, unless a node dropped them.
DEFERRED_WAIT_S = 1.0
# The least a priming frame is waited for, however close the priming's deadline.
PRIME_MIN_WAIT_S = 0.5
PRIME_LOG_LINES = 3


@dataclass
class FrameTiming:
    """Arrival of each output after the cloud was published, in ms (None: not received), and
    the output's own publication after the cloud's (None: not received, or the middleware
    gives no source time); ``waiting_cpu_ms``: the CPU time the probe's process (every thread
    of it) took while it waited for the awaited outputs, taken from the nodes it times."""

    stamp_ns: int
    after_publish_ms: dict[str, float | None] = field(default_factory=dict)
    published_ms: dict[str, float | None] = field(default_factory=dict)
    counts: dict[str, int] = field(default_factory=dict)
    waiting_cpu_ms: float = 0.0


@dataclass
class NodeSession:
    mode: str
    domain_id: int
    probe: Probe
    processes: list[NodeProcess]
    log_dir: Path

    def check_alive(self) -> None:
        for proc in self.processes:
            if not proc.alive():
                tail = proc.log()[-2000:]
                raise ConfigError(f"{proc.name} exited with {proc.popen.returncode}:\n{tail}")

    def wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        wanted = READY_SUBSCRIBERS[self.mode]
        while not self.probe.wait_for_graph(wanted, READY_PUBLISHERS, timeout_s=0.5):
            self.check_alive()
            if time.monotonic() > deadline:
                raise ConfigError(f"the {self.mode} nodes were not up within {timeout_s} s")

    def frame(
        self,
        cloud: CloudData | np.ndarray,
        stamp_ns: int,
        pose: Pose2D | None = None,
        timeout_s: float = 10.0,
        wait_for: tuple[str, ...] = OUTPUTS,
        frame_id: str = "lidar",
        counted: bool = True,
    ) -> FrameTiming:
        """Publish odometry and a cloud with one stamp; wait for the outputs of that stamp.
        ``counted``: read each output's table for its row count (``FrameTiming.counts``)."""
        if pose is not None:
            self.probe.publish_odometry(stamp_ns, pose.x, pose.y, pose.yaw)
        data = points_to_cloud(cloud) if isinstance(cloud, np.ndarray) else cloud
        self.probe.publish_cloud(data, stamp_ns, frame_id)
        return self.collect(stamp_ns, timeout_s, wait_for, counted)

    def sectors(
        self,
        parts: Sequence[np.ndarray],
        stamps_ns: Sequence[int],
        poses: Sequence[Pose2D | None],
        gap_s: float,
        timeout_s: float = 10.0,
        wait_for: tuple[str, ...] = OUTPUTS,
        counted: bool = True,
    ) -> FrameTiming:
        """Publish one scan as sector clouds ``gap_s`` apart, as a spinning lidar's driver
        sends them; wait for the outputs of the last sector's stamp (the revolution's)."""
        for k, (part, stamp, pose) in enumerate(zip(parts, stamps_ns, poses, strict=True)):
            if k:
                self.probe.spin_for(gap_s)
            if pose is not None:
                self.probe.publish_odometry(stamp, pose.x, pose.y, pose.yaw)
            self.probe.publish_cloud(points_to_cloud(part), stamp)
        return self.collect(stamps_ns[-1], timeout_s, wait_for, counted)

    def collect(
        self, stamp_ns: int, timeout_s: float, wait_for: tuple[str, ...], counted: bool = True
    ) -> FrameTiming:
        """Wait for the outputs of ``stamp_ns``: when each came after it was published, and
        with ``counted`` the rows of each (reading a table is milliseconds of the harness's
        time: a predicted path pose is a row)."""
        got = self.probe.received
        later = self.probe.deferred
        now = [t for t in wait_for if t not in later]

        def arrived() -> bool:
            return all(stamp_ns in got[t] for t in now)

        cpu_s = time.process_time()
        if all(t in OBJECT_TOPICS for t in now):
            self.probe.await_objects(now, arrived, timeout_s)
        else:
            self.probe.spin_until(arrived, timeout_s)
        waiting_cpu_ms = (time.process_time() - cpu_s) * 1e3
        # Published before what was waited for, they wait in the middleware, stamped on arrival.
        # A deferred topic that is none of the outputs timed here is taken as it comes.
        timed = [t for t in later if t in OUTPUTS]
        self.probe.read_deferred(
            lambda: all(stamp_ns in got[t] for t in timed),
            timeout_s if set(later) & set(wait_for) else DEFERRED_WAIT_S,
        )
        sent = self.probe.published[stamp_ns]
        timing = FrameTiming(stamp_ns, waiting_cpu_ms=waiting_cpu_ms)
        for topic in OUTPUTS:
            item = got[topic].get(stamp_ns)
            timing.after_publish_ms[topic] = None if item is None else (item.t_s - sent) * 1e3
            published = None if item is None else item.published_s
            timing.published_ms[topic] = None if published is None else (published - sent) * 1e3
            if counted and item is not None and item.table is not None:
                timing.counts[topic] = int(item.table.shape[0])
                if topic == PREDICTED:
                    timing.counts["agents"] = int(np.unique(item.table["id"]).size)
        return timing

    def prime(
        self, cloud: np.ndarray, first_ns: int, within_s: float, frame_timeout_s: float
    ) -> int:
        """Send frames a scan period apart until one comes all the way through in the
        odometry's frame; the next stamp. Discovery has settled then, and every node has
        taken odometry: one that reads a scan before its first odometry tracks in the
        sensor's frame, and resets its tracks when it switches, a few frames into what follows.

        Bounded by time, not by a count of frames: under load a node may match the probe's
        odometry writer seconds after the probe saw it, and meanwhile answers every scan in
        the sensor's frame within milliseconds.
        """
        deadline = time.monotonic() + within_s
        stamp = first_ns
        answered: Counter[str] = Counter()
        while True:
            wait_s = max(min(frame_timeout_s, deadline - time.monotonic()), PRIME_MIN_WAIT_S)
            self.frame(cloud, stamp, Pose2D(), wait_s, wait_for=(PREDICTED,))
            came = self.probe.received[PREDICTED].get(stamp)
            stamp += STAMP_STEP_NS
            if came is not None and came.frame_id == ODOM_FRAME:
                return stamp
            answered["lost" if came is None else f"in {came.frame_id!r}"] += 1
            self.check_alive()
            if time.monotonic() >= deadline:
                break
            if came is not None:
                self.probe.spin_for(STAMP_STEP_NS / 1e9)
        frames = ", ".join(f"{n} {outcome}" for outcome, n in answered.items())
        raise ConfigError(
            f"no predictions in {ODOM_FRAME!r} came back within {within_s} s "
            f"(of {answered.total()} frames: {frames}); {self._odometry_lines()}"
        )

    def _odometry_lines(self) -> str:
        """What each node last logged of odometry and frames: why none tracks in odom."""
        said = []
        for proc in self.processes:
            lines = [ln for ln in proc.log().splitlines() if "odometry" in ln or "frame" in ln]
            said.append(f"{proc.name}: " + (" | ".join(lines[-PRIME_LOG_LINES:]) or "nothing"))
        return "; ".join(said)

    def stop(self, sig: int = signal.SIGINT) -> dict[str, int]:
        return {proc.name: proc.stop(sig) for proc in self.processes}


@contextmanager
def node_session(
    mode: str,
    *,
    params_file: Path | None = None,
    overrides: Mapping[str, bool | int | float | str] | None = None,
    log_dir: Path | None = None,
    startup_timeout_s: float = 120.0,
    read_markers: bool = True,
    deferred: Sequence[str] = (),
) -> Iterator[NodeSession]:
    """Start the nodes of ``mode`` and a probe on a leased domain; always stop them again.

    Without ``read_markers`` the probe leaves ``markers`` unread, so the nodes build none.
    The probe takes the ``deferred`` outputs of a frame only once it has those it waits for
    (``Probe.read_deferred``).
    """
    if mode not in MODES:
        raise ConfigError(f"mode must be one of {sorted(MODES)}, got {mode!r}")
    with ExitStack() as stack:
        domain = stack.enter_context(domain_lease())
        logs = log_dir or Path(stack.enter_context(tempfile.TemporaryDirectory()))
        env = dds_env(domain)
        # The probe's own participant reads these when it is created.
        stack.enter_context(dds_settings_applied())
        processes: list[NodeProcess] = []
        stack.callback(_stop_all, processes)
        for name in MODES[mode]:
            processes.append(
                start_node(
                    name,
                    env=env,
                    log_dir=logs,
                    params_file=params_file or config_path("x86_dev.param.yaml"),
                    overrides=overrides,
                )
            )
        probe = stack.enter_context(probe_session(domain, markers=read_markers, deferred=deferred))
        session = NodeSession(mode, domain, probe, processes, logs)
        session.wait_ready(startup_timeout_s)
        yield session


def _stop_all(processes: list[NodeProcess]) -> None:
    for proc in processes:
        proc.stop(signal.SIGINT)
