"""Sector clouds grouped into revolutions: by count or by azimuth, lost sectors, time jumps."""

from __future__ import annotations

from collections.abc import Generator, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dynshape_perception.errors import ConfigError, InputValueError, ShapeError
from dynshape_perception.io.datasets import read_kitti_bin
from dynshape_perception.perception.pipeline import Pipeline
from dynshape_perception.perception.sectors import SectorAssembler
from dynshape_perception.perception.streaming import NearField
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.scheduling.executor import TieredExecutor
from dynshape_perception.scheduling.lidar_tiers import Segmentation
from dynshape_perception.tools.sim.scenes import driving_scene, sensor_sectors

CHUNK_POINTS = 16384
# 10 degrees each.
SECTORS = 36
PERIOD_S = 0.1


def _not_called(*_: object) -> list[np.ndarray]:
    raise AssertionError("segmentation calls the segmenter only")


def run(job: Generator[None, None, Any]) -> Any:
    while True:
        try:
            next(job)
        except StopIteration as stop:
            return stop.value


def revolutions(
    points: np.ndarray, sectors: int, turns: int, lost: tuple[int, int] | None = None
) -> Iterator[tuple[float, np.ndarray]]:
    """``turns`` revolutions of one scan as sectors, stamped through each revolution;
    ``lost``: (turn, sector) that never arrives."""
    parts = sensor_sectors(points, sectors)
    for turn in range(turns):
        for k, part in enumerate(parts):
            if (turn, k) != lost:
                yield 10.0 + turn * PERIOD_S + k * PERIOD_S / sectors, part


@pytest.fixture(scope="module")
def kitti(kitti_bin: Path) -> np.ndarray:
    return read_kitti_bin(kitti_bin)


def segmentation(engine: Engine, executor: TieredExecutor) -> Segmentation:
    segmenter = engine["segmenter"]
    pipeline = Pipeline(segmenter, _not_called, _not_called)
    return Segmentation(segmenter, segmenter, pipeline, NearField(), executor, (CHUNK_POINTS,))


def test_kitti_revolutions_give_the_whole_scan_obstacles(engine: Engine, kitti: np.ndarray) -> None:
    """Near-field obstacles come per sector; the full ones once per revolution, those of the
    whole scan as a driver publishing whole scans would send it (sectors end to end)."""
    parts = sensor_sectors(kitti, SECTORS)
    whole = np.concatenate(parts)
    # The scan is cropped to the camera's view: sectors behind hold no points.
    sectors = sum(p.shape[0] > 0 for p in parts)
    last = max(k for k, p in enumerate(parts) if p.shape[0])
    assembler = SectorAssembler(sectors)
    with TieredExecutor(start=False) as executor:
        streamed = segmentation(engine, executor)
        reference = segmentation(engine, executor)
        want = run(reference.full_cloud(whole, seed=1))
        got = []
        near_sectors = 0
        for k, (stamp, part) in enumerate(revolutions(kitti, SECTORS, 2)):
            if part.shape[0]:
                near = streamed.near_field(part)()
                near_sectors += near.obstacles.shape[0] > 0
            done = assembler.add(part, stamp)
            # Given out with its last sector.
            assert len(done) == (k % SECTORS == last)
            for revolution in done:
                assert revolution.complete and revolution.sectors == sectors
                np.testing.assert_array_equal(revolution.points, whole)
                got.append(run(streamed.full_cloud(revolution.points, seed=1)))
    assert len(got) == 2 and near_sectors >= 1
    for cloud in got:
        assert cloud.obstacles.shape[0] > 5
        np.testing.assert_array_equal(cloud.obstacles, want.obstacles)
    assert assembler.counters.as_dict() == {
        "sectors": 2 * SECTORS,
        "empty_sectors": 2 * (SECTORS - sectors),
        "revolutions": 2,
        "incomplete_revolutions": 0,
        "discarded_sectors": 0,
        "short_revolutions": 0,
    }


def test_the_count_is_detected_from_azimuth_coverage() -> None:
    scan = driving_scene(seed=3, fov_deg=360.0).points
    assembler = SectorAssembler()
    given: list[int] = []
    for k, (stamp, part) in enumerate(revolutions(scan, 12, 4)):
        for revolution in assembler.add(part, stamp):
            assert revolution.complete and revolution.sectors == 12
            np.testing.assert_array_equal(
                revolution.points, np.concatenate(sensor_sectors(scan, 12))
            )
            given.append(k)
    # The first revolution ends when the second begins; then each with its last sector.
    assert given == [12, 23, 35, 47]
    assert assembler.sectors_per_revolution == 12


@pytest.mark.parametrize(("configured", "short"), [(4, 0), (12, 0), (2, 17), (3, 11)])
def test_a_count_below_the_drivers_is_counted_as_short_revolutions(
    configured: int, short: int
) -> None:
    """Three turns of 12 sectors; configured with fewer, every revolution given out by count
    but the last is followed by a sector in azimuths it did not cover."""
    scan = driving_scene(seed=3, fov_deg=360.0).points
    driver = 4 if configured == 4 else 12
    assembler = SectorAssembler(configured)
    for stamp, part in revolutions(scan, driver, 3):
        assembler.add(part, stamp)
    assert assembler.counters.short_revolutions == short


def test_a_front_facing_scan_counts_its_sectors_with_points() -> None:
    scan = driving_scene(seed=2, fov_deg=180.0).points
    parts = sensor_sectors(scan, 12)
    with_points = sum(p.shape[0] > 0 for p in parts)
    assembler = SectorAssembler()
    done = [r for stamp, part in revolutions(scan, 12, 3) for r in assembler.add(part, stamp)]
    assert assembler.sectors_per_revolution == with_points < 12
    assert [r.sectors for r in done] == [with_points] * 3
    assert assembler.counters.empty_sectors == 3 * (12 - with_points)


def test_a_lost_sector_gives_an_incomplete_revolution(kitti: np.ndarray) -> None:
    sectors = sum(p.shape[0] > 0 for p in sensor_sectors(kitti, SECTORS))
    first = min(k for k, p in enumerate(sensor_sectors(kitti, SECTORS)) if p.shape[0])
    assembler = SectorAssembler(sectors)
    stream = revolutions(kitti, SECTORS, 3, lost=(1, first + 2))
    done = [r for stamp, part in stream for r in assembler.add(part, stamp)]
    assert [(r.sectors, r.complete) for r in done] == [
        (sectors, True),
        (sectors - 1, False),
        (sectors, True),
    ]
    assert assembler.counters.incomplete_revolutions == 1


def test_a_scan_joined_after_its_first_sectors_aligns_on_the_next_one(kitti: np.ndarray) -> None:
    """A node started mid-revolution: the front-facing scan's next first sector jumps back
    against the turn, so revolutions end with their own last sector from then on."""
    parts = [p for p in sensor_sectors(kitti, SECTORS) if p.shape[0]]
    assembler = SectorAssembler(len(parts))
    stamps = iter(10.0 + 0.001 * k for k in range(1000))
    done = [r for p in parts[3:] for r in assembler.add(p, next(stamps))]
    assert done == []
    for _ in range(2):
        done = [r for p in parts for r in assembler.add(p, next(stamps))]
        assert [r.sectors for r in done] in ([len(parts) - 3, len(parts)], [len(parts)])
        assert done[-1].complete
        np.testing.assert_array_equal(done[-1].points, np.concatenate(parts))


@pytest.mark.parametrize("clockwise", [True, False])
def test_either_turn_of_the_sensor_is_learnt(kitti: np.ndarray, clockwise: bool) -> None:
    parts = [p for p in sensor_sectors(kitti, SECTORS, clockwise=clockwise) if p.shape[0]]
    assembler = SectorAssembler(len(parts))
    stamps = iter(10.0 + 0.001 * k for k in range(1000))
    done = [r for _ in range(4) for p in parts for r in assembler.add(p, next(stamps))]
    # A counter-clockwise sensor's first step reads as a jump until the turn is learnt.
    assert [r.complete for r in done][-3:] == [True, True, True]
    assert all(r.sectors == len(parts) for r in done[-3:])


def test_a_time_jump_backwards_discards_the_revolution_in_progress(kitti: np.ndarray) -> None:
    parts = [p for p in sensor_sectors(kitti, SECTORS) if p.shape[0]]
    assembler = SectorAssembler(len(parts))
    for k in range(3):
        assert assembler.add(parts[k], 20.0 + k * 0.01) == []
    for k, part in enumerate(parts):
        done = assembler.add(part, 5.0 + k * 0.01)
    assert [r.sectors for r in done] == [len(parts)]
    assert done[0].first_stamp_s == 5.0
    assert done[0].stamp_s == pytest.approx(5.0 + (len(parts) - 1) * 0.01)
    assert assembler.counters.discarded_sectors == 3
    assert assembler.flush() is None


def test_flush_gives_the_revolution_in_progress(kitti: np.ndarray) -> None:
    parts = [p for p in sensor_sectors(kitti, SECTORS) if p.shape[0]]
    assembler = SectorAssembler(len(parts))
    assembler.add(parts[0], 1.0)
    assembler.add(parts[1], 1.01)
    rest = assembler.flush()
    assert rest is not None and rest.sectors == 2 and not rest.complete
    np.testing.assert_array_equal(rest.points, np.concatenate(parts[:2]))


def test_bad_sectors_are_refused() -> None:
    assembler = SectorAssembler()
    with pytest.raises(ShapeError, match=r"\[P, 4\]"):
        assembler.add(np.zeros((5, 3), np.float32), 1.0)
    with pytest.raises(InputValueError, match="NaN"):
        assembler.add(np.full((2, 4), np.nan, np.float32), 1.0)
    with pytest.raises(InputValueError, match="finite"):
        assembler.add(np.zeros((2, 4), np.float32), float("nan"))
    with pytest.raises(ConfigError, match="detect"):
        SectorAssembler(-1)
    with pytest.raises(ConfigError, match="integer"):
        SectorAssembler(2.5)  # type: ignore[arg-type]
    assert assembler.counters.sectors == 0
