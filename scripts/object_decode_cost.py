"""Microseconds to read a DetectedObjects and a TrackedObjects from CDR: fast path vs generic.

Usage: PYTHON scripts/object_decode_cost.py [OBJECTS] [ROUNDS]  (default: 40 2000)
"generic" reads the objects one by one (``decode(..., fast=False)``) and takes each box's yaw
and label one at a time, as before the fast path; "fast" is ``obstacles_from_detected_objects``
and ``tracks_from_tracked_objects`` as the nodes call them. The two alternate in one process
(medians of ROUNDS calls each), and their outputs are checked equal first.
"""

from __future__ import annotations

import statistics
import sys
import time
from collections.abc import Callable

import numpy as np
from object_message_cost import _inputs

from dynshape_perception.io import objects as o
from dynshape_perception.io.cdr import ObjectArrays, decode, encode
from dynshape_perception.io.classes import label_of_classification
from dynshape_perception.perception.records import OBSTACLE_DTYPE, TRACK_DTYPE

US_PER_S = 1e6


def _generic_box_rows(arrays: ObjectArrays, dtype: np.dtype) -> np.ndarray:
    out = np.zeros(arrays.size, dtype=dtype)
    poses = arrays.poses
    out["x"], out["y"], out["z"] = poses[:, 0], poses[:, 1], poses[:, 2]
    out["yaw"] = [o._yaw(*q) for q in poses[:, 3:7].tolist()]
    dims = arrays.dimensions
    out["length"], out["width"], out["height"] = dims[:, 0], dims[:, 1], dims[:, 2]
    out["score"] = arrays.existence
    out["label"] = [label_of_classification(c) for c in arrays.labels.tolist()]
    return out


def _generic_obstacles(data: bytes) -> np.ndarray:
    arrays = decode(o.DETECTED_OBJECTS, data, fast=False).arrays
    return o._check_boxes(_generic_box_rows(arrays, OBSTACLE_DTYPE), "detected object")


def _generic_tracks(data: bytes) -> np.ndarray:
    arrays = decode(o.TRACKED_OBJECTS, data, fast=False).arrays
    table = _generic_box_rows(arrays, TRACK_DTYPE)
    yaw = table["yaw"].astype(np.float64)
    c, s = np.cos(yaw), np.sin(yaw)
    vx, vy = arrays.twists[:, 0], arrays.twists[:, 1]
    table["vx"], table["vy"] = c * vx - s * vy, s * vx + c * vy
    return o._check_boxes(table, "tracked object")


def _fast_tracks(data: bytes) -> np.ndarray:
    return o.tracks_from_tracked_objects(data).tracks


def main() -> int:
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 40
    rounds = int(sys.argv[2]) if len(sys.argv) > 2 else 2000
    inputs = _inputs(n)
    pairs: dict[str, tuple[Callable[[bytes], np.ndarray], Callable[[bytes], np.ndarray], bytes]] = {
        "obstacles_from_detected_objects": (
            _generic_obstacles,
            o.obstacles_from_detected_objects,
            encode(o.DETECTED_OBJECTS, inputs[o.DETECTED_OBJECTS]()),
        ),
        "tracks_from_tracked_objects": (
            _generic_tracks,
            _fast_tracks,
            encode(o.TRACKED_OBJECTS, inputs[o.TRACKED_OBJECTS]()),
        ),
    }
    times: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in pairs}
    for name, (generic, fast, data) in pairs.items():
        if generic(data).tobytes() != fast(data).tobytes():
            print(f"{name}: the fast path's rows differ")
            return 1
    for _ in range(rounds):
        for name, (generic, fast, data) in pairs.items():
            for i, read in enumerate((generic, fast)):
                t0 = time.perf_counter()
                read(data)
                times[name][i].append((time.perf_counter() - t0) * US_PER_S)
    print(f"{n} objects; median us of {rounds} alternating calls")
    print(f"{'reader':<34}{'generic':>9}{'fast':>9}")
    for name, (generic_us, fast_us) in times.items():
        print(f"{name:<34}{statistics.median(generic_us):>9.1f}{statistics.median(fast_us):>9.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
