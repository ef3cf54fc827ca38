"""Tests of the multi-object tracker."""

from __future__ import annotations

import numpy as np
import pytest

from dynshape_perception.config import Bounds
from dynshape_perception.errors import (
    BoundError,
    ConfigError,
    InputValueError,
    ShapeError,
)
from dynshape_perception.perception.features import ASSOC_FEATURES
from dynshape_perception.perception.records import OBSTACLE_DTYPE, TRACK_DTYPE
from dynshape_perception.perception.tracking import (
    Tracker,
    TrackerParams,
    reference_affinity,
)

FRAME_S = 0.1
PARAMS = TrackerParams(gate_distance_m=2.0, max_missed_frames=4, min_hits_to_confirm=3)


def _obstacles(xy: list[tuple[float, float]] | np.ndarray) -> np.ndarray:
    points = np.asarray(xy, dtype=np.float64).reshape(-1, 2)
    rows = np.zeros(points.shape[0], dtype=OBSTACLE_DTYPE)
    rows["x"], rows["y"] = points[:, 0], points[:, 1]
    rows["length"], rows["width"], rows["height"] = 0.6, 0.6, 1.7
    rows["score"] = 0.9
    return rows


class CountingAffinity:
    """Gaussian-distance affinity that records its calls and refuses empty inputs."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, det: np.ndarray, trk: np.ndarray) -> np.ndarray:
        assert det.shape[0] > 0 and trk.shape[0] > 0
        assert det.shape[1] == trk.shape[1] == ASSOC_FEATURES
        self.calls += 1
        return reference_affinity(det, trk)


def _id_at(tracks: np.ndarray, xy: tuple[float, float], tol_m: float = 0.5) -> int | None:
    if tracks.size == 0:
        return None
    dist = np.hypot(tracks["x"] - xy[0], tracks["y"] - xy[1])
    best = int(np.argmin(dist))
    return int(tracks["id"][best]) if dist[best] < tol_m else None


def test_reference_affinity_in_unit_range() -> None:
    det = np.zeros((2, ASSOC_FEATURES), np.float32)
    trk = np.zeros((3, ASSOC_FEATURES), np.float32)
    trk[1, 0] = 1.0
    trk[2, 0] = 50.0
    aff = reference_affinity(det, trk)
    assert aff.shape == (2, 3) and aff.dtype == np.float32
    np.testing.assert_allclose(aff[0], [1.0, np.exp(-0.5), 0.0], atol=1e-6)
    assert reference_affinity(det[:0], trk).shape == (0, 3)
    assert reference_affinity(det, trk[:0]).shape == (2, 0)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("gate_distance_m", 0.0),
        ("min_affinity", 1.5),
        ("max_missed_frames", -1),
        ("min_hits_to_confirm", 0),
        ("velocity_smoothing", 0.0),
        ("max_history_s", -1.0),
    ],
)
def test_params_validated(name: str, value: float) -> None:
    with pytest.raises(ConfigError, match=name):
        TrackerParams(**{name: value})  # type: ignore[arg-type]


def test_inputs_of_the_wrong_kind_are_package_errors() -> None:
    tracker = Tracker(reference_affinity)
    with pytest.raises(ShapeError, match="OBSTACLE_DTYPE"):
        tracker.update([], 0.0)  # type: ignore[arg-type]
    with pytest.raises(InputValueError, match="number of seconds"):
        tracker.update(np.zeros(0, OBSTACLE_DTYPE), "1.0")  # type: ignore[arg-type]
    assert tracker.update(np.zeros(0, OBSTACLE_DTYPE), 1.0).shape == (0,)


def test_three_objects_stable_ids_through_occlusion_and_new_id_after_death() -> None:
    starts = np.array([[0.0, 0.0], [0.0, 5.0], [10.0, -5.0]])
    velocities = np.array([[1.5, 0.0], [8.0, 0.5], [-1.2, 0.3]])
    # Object 1 moves 0.8 m a frame: without motion prediction it leaves the gate in 3 frames.
    occluded_frames = range(10, 13)
    affinity = CountingAffinity()
    tracker = Tracker(affinity, PARAMS)
    ids_seen: list[set[int]] = [set(), set(), set()]
    for frame in range(30):
        truth = starts + velocities * frame * FRAME_S
        visible = [0, 2] if frame in occluded_frames else [0, 1, 2]
        tracks = tracker.update(_obstacles(truth[visible]), frame * FRAME_S)
        assert tracks.dtype == TRACK_DTYPE
        if frame < PARAMS.min_hits_to_confirm - 1:
            assert tracks.size == 0
            continue
        assert tracks.size == 3, f"frame {frame}: {tracks.size} tracks"
        for obj in range(3):
            track_id = _id_at(tracks, tuple(truth[obj]))
            assert track_id is not None, f"frame {frame}: object {obj} lost"
            ids_seen[obj].add(track_id)
    assert all(len(ids) == 1 for ids in ids_seen), ids_seen
    first_ids = {track_id for ids in ids_seen for track_id in ids}
    assert len(first_ids) == 3
    assert tracker.dead_ids_since_last() == []
    np.testing.assert_allclose(
        np.stack([tracks["vx"], tracks["vy"]], axis=1)[np.argsort(tracks["id"])],
        velocities,
        atol=1e-3,
    )
    assert affinity.calls > 0

    # Object 2 vanishes for good; its track dies after max_missed_frames misses.
    (id_two,) = ids_seen[2]
    stamp = 30 * FRAME_S
    for miss in range(1, PARAMS.max_missed_frames + 2):
        truth = starts + velocities * stamp
        tracker.update(_obstacles(truth[:2]), stamp)
        if miss <= PARAMS.max_missed_frames:
            assert id_two in tracker.live_ids()
        else:
            assert id_two not in tracker.live_ids()
            assert tracker.dead_ids_since_last() == [id_two]
            with pytest.raises(InputValueError, match=f"id {id_two}"):
                tracker.history(id_two)
        stamp += FRAME_S
    tracker.update(_obstacles((starts + velocities * stamp)[:2]), stamp)
    assert tracker.dead_ids_since_last() == []

    # Something reappears where object 2 would be: a fresh id, never a reused one.
    stamp += FRAME_S
    truth = starts + velocities * stamp
    tracker.update(_obstacles(truth), stamp)
    new_ids = set(tracker.live_ids()) - first_ids
    assert len(new_ids) == 1 and min(new_ids) > max(first_ids)


def test_empty_frames() -> None:
    affinity = CountingAffinity()
    tracker = Tracker(affinity, TrackerParams(min_hits_to_confirm=1))
    empty = np.zeros(0, dtype=OBSTACLE_DTYPE)
    out = tracker.update(empty, 0.0)  # N = 0 and M = 0
    assert out.size == 0 and out.dtype == TRACK_DTYPE and tracker.live_ids() == []
    out = tracker.update(_obstacles([(1.0, 1.0), (5.0, 5.0)]), 0.1)  # M = 0
    assert sorted(out["id"].tolist()) == [1, 2]
    assert affinity.calls == 0
    out = tracker.update(empty, 0.2)  # N = 0: tracks coast
    assert sorted(out["id"].tolist()) == [1, 2]
    assert affinity.calls == 0
    coasting = Tracker(affinity, TrackerParams(min_hits_to_confirm=1, publish_coasting=False))
    coasting.update(_obstacles([(1.0, 1.0)]), 0.0)
    assert coasting.update(empty, 0.1).size == 0
    assert coasting.live_ids() == [1]


def test_affinity_fn_handles_empty_sides() -> None:
    det = np.zeros((0, ASSOC_FEATURES), np.float32)
    trk = np.zeros((4, ASSOC_FEATURES), np.float32)
    assert reference_affinity(det, trk).shape == (0, 4)


def test_gate_forbids_far_pairs_even_with_high_affinity() -> None:
    tracker = Tracker(lambda d, t: np.ones((d.shape[0], t.shape[0]), np.float32), PARAMS)
    tracker.update(_obstacles([(0.0, 0.0)]), 0.0)
    tracker.update(_obstacles([(5.0, 0.0)]), 0.1)
    assert tracker.live_ids() == [1, 2]


def test_bound_drops_missed_then_fewest_hits() -> None:
    bounds = Bounds(M=4)
    tracker = Tracker(reference_affinity, TrackerParams(min_hits_to_confirm=1), bounds)
    tracker.update(_obstacles([(0, 0), (10, 0), (20, 0), (30, 0)]), 0.0)
    tracker.update(_obstacles([(0, 0), (10, 0), (20, 0), (30, 0)]), 0.1)
    # Tracks 3 and 4 miss while two new objects appear: 6 candidates for 4 slots.
    out = tracker.update(_obstacles([(0, 0), (10, 0), (50, 0), (60, 0)]), 0.2)
    assert sorted(out["id"].tolist()) == [1, 2, 5, 6]
    assert tracker.dropped_tracks == 2
    assert sorted(tracker.dead_ids_since_last()) == [3, 4]
    # With no missed track, the newborns (fewest hits) are the ones dropped.
    out = tracker.update(_obstacles([(0, 0), (10, 0), (50, 0), (60, 0), (80, 0)]), 0.3)
    assert sorted(out["id"].tolist()) == [1, 2, 5, 6]
    assert tracker.dropped_tracks == 3
    assert tracker.dead_ids_since_last() == []
    assert len(tracker.live_ids()) <= bounds.M


def test_history_is_measured_and_bounded() -> None:
    params = TrackerParams(min_hits_to_confirm=1, max_history_s=1.0)
    tracker = Tracker(reference_affinity, params)
    for frame in range(40):
        tracker.update(_obstacles([(0.5 * frame * FRAME_S, 1.0)]), 100.0 + frame * FRAME_S)
    stamps, xy = tracker.history(1)
    assert stamps.shape[0] == xy.shape[0] == 11
    np.testing.assert_allclose(stamps[-1] - stamps[0], 1.0, atol=1e-9)
    np.testing.assert_allclose(xy[:, 0], 0.5 * (stamps - 100.0), atol=1e-5)
    assert (np.diff(stamps) > 0).all()


def test_input_errors() -> None:
    tracker = Tracker(reference_affinity, PARAMS, Bounds(N=2))
    with pytest.raises(ShapeError, match="OBSTACLE_DTYPE"):
        tracker.update(np.zeros(1, dtype=TRACK_DTYPE), 0.0)
    with pytest.raises(BoundError, match="N=3"):
        tracker.update(_obstacles([(0, 0), (5, 0), (9, 0)]), 0.0)
    tracker.update(_obstacles([(0, 0)]), 1.0)
    with pytest.raises(InputValueError, match="increase"):
        tracker.update(_obstacles([(0, 0)]), 1.0)
    bad = Tracker(lambda d, t: np.zeros((1, 1), np.float32), PARAMS)
    bad.update(_obstacles([(0, 0)]), 0.0)
    with pytest.raises(ShapeError, match="affinity_fn"):
        bad.update(_obstacles([(0, 0), (5, 5)]), 0.1)
    assert bad.live_ids() == [1]
