"""The generated drive: seeded, counts spread over their ranges, occlusions that break tracks."""

from __future__ import annotations

import numpy as np
import pytest

from dynshape_perception.errors import ConfigError
from dynshape_perception.perception.records import LABEL_PEDESTRIAN
from dynshape_perception.tools.replay.sources import occlusion_gaps
from dynshape_perception.tools.sim.drive import DriveConfig, drive_frames, ego_pose

SMALL = DriveConfig(seed=4, frames=6, segment_frames=3, points_range=(5_000, 9_000))


def test_seeded_and_reproducible() -> None:
    a, b = list(drive_frames(SMALL)), list(drive_frames(SMALL))
    other = list(drive_frames(DriveConfig(**{**vars(SMALL), "seed": 5})))
    for fa, fb in zip(a, b, strict=True):
        assert np.array_equal(fa.points, fb.points)
        assert np.array_equal(fa.truth, fb.truth)
    assert not np.array_equal(a[0].points[:100], other[0].points[:100])


def test_counts_cover_their_ranges() -> None:
    frames = list(drive_frames(SMALL))
    points = sorted(f.points.shape[0] for f in frames)
    assert points[0] == 5_000 and points[-1] == 9_000 and len(set(points)) == len(points)
    objects = sorted({f.truth.shape[0] for f in frames})
    assert objects == [0, 80], "two segments: the ends of the objects range"
    busy = next(f for f in frames if f.truth.shape[0] == 80)
    moving = (busy.truth["label"] == LABEL_PEDESTRIAN) | (
        np.hypot(busy.truth["vx"], busy.truth["vy"]) > 0
    )
    assert int(moving.sum()) == 64
    assert len(np.unique(busy.truth["id"])) == 80
    for frame in frames:
        assert frame.points.dtype == np.float32 and np.isfinite(frame.points).all()
        assert frame.visible.shape[0] == int((frame.truth["num_points"] > 0).sum())
        returns = int(frame.truth["num_points"].sum())
        assert returns <= frame.points.shape[0]


def test_ego_moves_and_weaves() -> None:
    config = DriveConfig(ego_speed_mps=8.0)
    x0, y0, _, _, _ = ego_pose(config, 0.0)
    x1, y1, yaw1, speed, _ = ego_pose(config, 1.5)
    assert (x0, y0) == (0.0, 0.0)
    assert x1 == pytest.approx(12.0)
    assert y1 > 0.2 and abs(yaw1) < 0.05 and speed >= 8.0


def test_occlusions_break_tracks() -> None:
    config = DriveConfig(
        seed=3, frames=40, segment_frames=20, points_range=(20_000, 40_000), objects_range=(60, 80)
    )
    visible: dict[int, list[bool]] = {}
    for frame in drive_frames(config):
        for oid, n in zip(
            frame.truth["id"].tolist(), frame.truth["num_points"].tolist(), strict=True
        ):
            visible.setdefault(oid, []).append(n > 0)
    assert occlusion_gaps(visible, min_frames=6) >= 1


def test_bad_config() -> None:
    with pytest.raises(ConfigError, match="agents"):
        DriveConfig(objects_range=(0, 10), agents_range=(0, 20))
    with pytest.raises(ConfigError, match="frames"):
        DriveConfig(frames=0)


@pytest.mark.parametrize("speed", [float("nan"), float("inf"), -1.0])
def test_ego_speed_must_be_finite_and_non_negative(speed: float) -> None:
    with pytest.raises(ConfigError, match="ego_speed_mps"):
        DriveConfig(ego_speed_mps=speed)


@pytest.mark.parametrize("seed", [-1, 1.5, True])
def test_seed_must_be_a_non_negative_integer(seed: object) -> None:
    with pytest.raises(ConfigError, match="seed"):
        DriveConfig(seed=seed)  # type: ignore[arg-type]
