"""Microseconds of small calls on a node's frame path: warm, and after a frame's wait.

Usage: PYTHON scripts/cold_call_cost.py [ROUNDS] [--no-cpu-latency]  (default: 100)

A later node of the separate launch runs once a frame, after sleeping while the nodes
before it worked: its code and data have left the caches by then. Each call below is timed
three ways, the median of ROUNDS: right after the same call ("hot"), right after an 8 ms
sleep ("slept"), and right after 8 ms of NumPy work over 64 MB ("evicted", as while a scan
is segmented). Each row pairs what the nodes called before (the library's call or the
generic path) with what they call now; the two alternate in each round. The process holds
the nodes' CPU latency request (``power.max_cpu_latency_us``) where it may, as the nodes
do, unless told not to. The host's own level moves from run to run; compare within a row.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import numpy as np

from dynshape_perception.runtime.cpu_latency import DEFAULT_CPU_LATENCY_US, CpuLatency

WAIT_S = 0.008
CHURN_BYTES = 64 * 1024 * 1024
TRACKS = 40
US_PER_S = 1e6
Call = Callable[[], object]


def _pairs() -> list[tuple[str, Call, Call]]:
    """(what, the call before, the call now), each ready to be called again and again."""
    import rclpy
    from diagnostic_updater import (
        FrequencyStatusParam,
        TimeStampStatusParam,
        TopicDiagnostic,
        Updater,
    )
    from rclpy.node import Node
    from rclpy.time import Time
    from tf2_ros import Buffer, TransformException

    from dynshape_perception.errors import TransformError
    from dynshape_perception.io.objects import _problems_by_column, row_problems
    from dynshape_perception.nodes.diagnostics import TopicTicks
    from dynshape_perception.nodes.frames import StaticTree, Tf2Lookup
    from dynshape_perception.nodes.messages import time_msg, transform_msg
    from dynshape_perception.perception.objects import UuidIndex
    from dynshape_perception.perception.records import TRACK_DTYPE
    from dynshape_perception.perception.transforms import planar

    rclpy.init()
    updater = Updater(Node("cold_call_cost"))
    freq = FrequencyStatusParam({"min": 5.0, "max": 20.0}, 0.1, 5)
    stamps = TimeStampStatusParam(-1.0, 5.0)
    library = TopicDiagnostic("/before", updater, freq, stamps)
    ticks = TopicTicks(TopicDiagnostic("/now", updater, freq, stamps))
    buffer = Buffer()
    lookup = Tf2Lookup(buffer)
    tree = StaticTree()
    mount = transform_msg("base_link", "lidar", planar(1.2, 0.0, 0.1, z=1.8), time_msg(0))
    buffer.set_transform_static(mount, "cold_call_cost")
    tree.add("base_link", "lidar", static=True)
    kept = Tf2Lookup(buffer, tree)
    rng = np.random.default_rng(0)
    tracks = np.zeros(TRACKS, TRACK_DTYPE)
    for name in TRACK_DTYPE.names or ():
        tracks[name] = rng.uniform(0.5, 4.0, TRACKS)
    uuids = rng.integers(0, 256, (TRACKS, 16), dtype=np.uint8)
    one_by_one, rows = UuidIndex(), UuidIndex()

    def unmounted_before() -> None:
        try:
            buffer.lookup_transform("base_link", "radar", Time(nanoseconds=5 * 10**9))
        except TransformException:
            pass

    def unmounted_now() -> None:
        try:
            lookup.lookup("base_link", "radar", 5.0)
        except TransformError:
            pass

    def tick_now() -> None:
        ticks.tick(time.time())
        if len(ticks.pending) > 1000:
            ticks.fold()

    return [
        ("topic rate and stamp check, one message", lambda: library.tick(time.time()), tick_now),
        (
            "fixed frame on TF? (no TF for it)",
            lambda: buffer.can_transform("odom", "base_link", Time()),
            lambda: lookup.connected("odom", "base_link"),
        ),
        (
            "sensor mount on /tf_static",
            lambda: lookup.lookup("base_link", "lidar", 5.0),
            lambda: kept.lookup("base_link", "lidar", 5.0),
        ),
        ("sensor mount not on TF (parameters)", unmounted_before, unmounted_now),
        (
            f"row check, {TRACKS} tracks",
            lambda: _problems_by_column(tracks, "tracked object"),
            lambda: row_problems(tracks, "tracked object"),
        ),
        (
            f"track ids of {TRACKS} UUIDs",
            lambda: one_by_one.update(uuids[:, :, None]),
            lambda: rows.update(uuids),
        ),
    ]


def main(argv: list[str]) -> int:
    rounds = int(argv[0]) if argv and argv[0].isdigit() else 100
    request = None if "--no-cpu-latency" in argv else CpuLatency(DEFAULT_CPU_LATENCY_US)
    print(f"CPU latency request: {request.summary() if request else 'none'}")
    pairs = _pairs()
    churn = np.ones(CHURN_BYTES // 8)

    def slept() -> None:
        time.sleep(WAIT_S)

    def evicted() -> None:
        end = time.perf_counter() + WAIT_S
        while time.perf_counter() < end:
            churn[::8].sum()

    # "hot": the call just made, untimed.
    waits: dict[str, Callable[[], object] | None] = {
        "hot": None,
        "slept": slept,
        "evicted": evicted,
    }
    times: dict[tuple[int, int, str], list[float]] = {}
    for _, before, now in pairs:
        before(), now()
    for _ in range(rounds):
        for w, wait in waits.items():
            for p, (_, before, now) in enumerate(pairs):
                for side, call in enumerate((before, now)):
                    (wait or call)()
                    t0 = time.perf_counter()
                    call()
                    times.setdefault((p, side, w), []).append(time.perf_counter() - t0)
    print(f"median µs of {rounds} calls; before -> now")
    print(f"{'call':42s}" + "".join(f"{w:>18s}" for w in waits))
    for p, (what, _, _) in enumerate(pairs):
        cells = []
        for w in waits:
            b, n = (statistics.median(times[p, side, w]) * US_PER_S for side in (0, 1))
            cells.append(f"{b:7.1f} -> {n:6.1f}")
        print(f"{what:42s}" + "".join(f"{c:>18s}" for c in cells))
    if request is not None:
        request.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
