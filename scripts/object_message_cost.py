"""Milliseconds to build and to read one object message: message objects vs CDR with NumPy.

Usage: PYTHON scripts/object_message_cost.py [AGENTS] [REPEATS]  (default: 32 50)
AGENTS tracks, all predicted (6 paths of 12 poses), as the nodes publish them. Per type it
prints the median of REPEATS: "objects" builds the message field by field as rclpy objects
(testing/object_messages.py) and serialises it, "cdr" is io.objects' writer; reading,
"objects" deserialises with rclpy and reads the table from the message object, "cdr" reads
the table from the bytes.
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from collections.abc import Callable

import numpy as np
from rclpy.serialization import deserialize_message, serialize_message

from dynshape_perception.io.cdr import ObjectArrays, encode
from dynshape_perception.io.objects import (
    DETECTED_OBJECTS,
    PREDICTED_OBJECTS,
    TRACKED_OBJECTS,
    TrackStates,
    detected_arrays,
    obstacles_from_detected_objects,
    predicted_arrays,
    predictions_from_predicted_objects,
    tracked_arrays,
    tracks_from_tracked_objects,
)
from dynshape_perception.nodes.messages import message_class, ros_message
from dynshape_perception.perception.objects import ObjectParams, TrackUuids
from dynshape_perception.perception.prediction.paths import PredictedPaths
from dynshape_perception.perception.records import OBSTACLE_DTYPE, TRACK_DTYPE
from dynshape_perception.testing.object_messages import reference_message

PATHS, POSES = 6, 12
MS_PER_S = 1000.0


def _inputs(agents: int) -> dict[str, Callable[[], ObjectArrays]]:
    rng = np.random.default_rng(0)
    tracks = np.zeros(agents, TRACK_DTYPE)
    tracks["id"] = np.arange(agents)
    for name in ("x", "y", "yaw", "vx", "vy"):
        tracks[name] = rng.normal(scale=10.0, size=agents)
    tracks["length"], tracks["width"], tracks["height"] = 4.0, 1.8, 1.5
    states = TrackStates(
        tracks,
        TrackUuids(uuid.UUID(int=1)).of(tracks["id"]),
        np.full(agents, 0.9, np.float32),
        np.zeros(agents, np.uint32),
    )
    paths = PredictedPaths(
        tracks["id"].astype(np.uint32),
        rng.normal(scale=20.0, size=(agents, PATHS, POSES, 2)).astype(np.float32),
        np.full((agents, PATHS), 1.0 / PATHS, np.float32),
        0.1,
    )
    obstacles = np.zeros(agents, OBSTACLE_DTYPE)
    for name in ("x", "y", "yaw", "length", "width", "height"):
        obstacles[name] = tracks[name]
    obstacles["score"] = 0.8
    params = ObjectParams()
    return {
        DETECTED_OBJECTS: lambda: detected_arrays(0, "base_link", obstacles),
        TRACKED_OBJECTS: lambda: tracked_arrays(0, "map", states, params),
        PREDICTED_OBJECTS: lambda: predicted_arrays(0, "map", states, paths, params),
    }


READERS: dict[str, Callable[[object], object]] = {
    DETECTED_OBJECTS: obstacles_from_detected_objects,
    TRACKED_OBJECTS: tracks_from_tracked_objects,
    PREDICTED_OBJECTS: predictions_from_predicted_objects,
}


def _median_ms(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        run()
        times.append((time.perf_counter() - t0) * MS_PER_S)
    return statistics.median(times)


def _row(msgtype: str, arrays_of: Callable[[], ObjectArrays], repeats: int) -> str:
    cls, read = message_class(msgtype), READERS[msgtype]
    data = encode(msgtype, arrays_of())
    built = _median_ms(
        lambda: serialize_message(reference_message(ros_message, msgtype, arrays_of())), repeats
    )
    cdr = _median_ms(lambda: encode(msgtype, arrays_of()), repeats)
    read_objects = _median_ms(lambda: read(deserialize_message(data, cls)), repeats)
    read_cdr = _median_ms(lambda: read(data), repeats)
    name = msgtype.rsplit("/", 1)[-1]
    return f"{name:<18}{built:>14.2f}{cdr:>11.2f}{read_objects:>14.2f}{read_cdr:>10.2f}"


def main() -> int:
    agents = int(sys.argv[1]) if len(sys.argv) > 1 else 32
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 50
    print(f"{agents} objects, {PATHS} paths x {POSES} poses each; median ms of {repeats}")
    print(f"{'type':<18}{'build objects':>14}{'build cdr':>11}{'read objects':>14}{'read cdr':>10}")
    for msgtype, arrays_of in _inputs(agents).items():
        print(_row(msgtype, arrays_of, repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
