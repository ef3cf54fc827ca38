"""The tier model of the nodes and the replay: order, sectors, speculation, determinism."""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pytest

from dynshape_perception.perception.pipeline import Pipeline, Pose2D
from dynshape_perception.perception.prediction.settings import PredictionSettings
from dynshape_perception.perception.prediction.stage import PredictionStage
from dynshape_perception.perception.sectors import SectorAssembler
from dynshape_perception.perception.streaming import NearField
from dynshape_perception.perception.tracking import reference_affinity
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.scheduling.executor import TieredExecutor
from dynshape_perception.scheduling.lidar_tiers import NearResult, Segmentation
from dynshape_perception.scheduling.perception_tiers import (
    FrameInfo,
    PerceptionTiers,
    Predicted,
    SimulatedClock,
    Tracked,
)
from dynshape_perception.tools.sim.drive import DriveConfig, DriveFrame, drive_frames
from dynshape_perception.tools.sim.scenes import sensor_sectors

DRIVE = DriveConfig(
    seed=4,
    frames=30,
    segment_frames=30,
    points_range=(8_000, 12_000),
    objects_range=(6, 12),
    agents_range=(3, 6),
)
SECTORS = 8
CHUNK_POINTS = 4096


def associator(function: str, det: np.ndarray, trk: np.ndarray) -> list[np.ndarray]:
    assert function == "forward"
    return [reference_affinity(det, trk)]


@dataclass
class Record:
    """Every result in the order the tiers gave it."""

    events: list[tuple[str, int]] = field(default_factory=list)
    near: list[NearResult] = field(default_factory=list)
    tracked: list[Tracked] = field(default_factory=list)
    predicted: list[Predicted] = field(default_factory=list)

    def on_near(self, frame: FrameInfo, result: NearResult) -> None:
        self.events.append(("near", frame.seed))
        self.near.append(result)

    def on_tracked(self, frame: FrameInfo, result: Tracked) -> None:
        self.events.append(("tracked", frame.seed))
        self.tracked.append(result)

    def on_predicted(self, frame: FrameInfo, result: Predicted) -> None:
        self.events.append(("predicted", frame.seed))
        self.predicted.append(result)


class Outputs:
    def __init__(self, record: Record) -> None:
        self.near = record.on_near
        self.tracked = record.on_tracked
        self.predicted = record.on_predicted


def strict(what: str, publish: Callable[[Any], None]) -> Callable[[Future[Any]], None]:
    """Every unit must complete: a failure or a shed unit fails the test."""

    def done(future: Future[Any]) -> None:
        assert not future.cancelled(), what
        err = future.exception()
        assert err is None, f"{what}: {err!r}"
        publish(future.result())

    return done


@pytest.fixture(scope="module")
def frames() -> list[DriveFrame]:
    return list(drive_frames(DRIVE))


def run(
    engine: Engine,
    frames: list[DriveFrame],
    per_revolution: int = 1,
    settings: PredictionSettings | None = None,
    track: bool = True,
) -> Record:
    """The drive through the tiers; with ``per_revolution`` > 1, as SECTORS sectors a scan
    (those with points make a revolution), stamped through the scan; with ``track`` False,
    through the point cloud node's tiers (near field and full obstacles, nothing tracked)."""
    record = Record()
    segmenter = engine["segmenter"]
    pipeline = Pipeline(segmenter, associator, engine["predictor"])
    clock = SimulatedClock()
    with TieredExecutor(start=False, clock=clock) as executor:
        segmentation = Segmentation(
            segmenter, segmenter, pipeline, NearField(), executor, (CHUNK_POINTS,)
        )
        if track:
            stage = PredictionStage(engine["predictor"], settings or PredictionSettings())
            sectors = SectorAssembler(per_revolution)
            tiers = PerceptionTiers(executor, segmentation, Outputs(record), strict, stage, sectors)
        else:
            tiers = PerceptionTiers(executor, segmentation, Outputs(record), strict, track=False)
        for frame in frames:
            split = per_revolution > 1
            parts = sensor_sectors(frame.points, SECTORS) if split else [frame.points]
            for k, part in enumerate(parts):
                if not part.shape[0]:
                    continue
                stamp = frame.stamp_s + k * DRIVE.period_s / SECTORS
                clock.now_s = stamp
                info = FrameInfo(
                    stamp, Pose2D(*frame.pose), executor.arrive("points"), 0.0, 0, frame.index
                )
                tiers.cloud(part, info)
                while executor.run_one():
                    pass
    return record


def test_each_tier_follows_the_one_before(engine: Engine, frames: list[DriveFrame]) -> None:
    record = run(engine, frames)
    assert record.events[:3] == [("near", 0), ("tracked", 0), ("predicted", 0)]
    assert record.events == [
        (kind, f.index) for f in frames for kind in ("near", "tracked", "predicted")
    ]
    assert sum(r.obstacles.shape[0] for r in record.near) > 0
    assert all(t.tracks is not None for t in record.tracked)
    assert sum(p.output.ids.size for p in record.predicted) > 20


def test_predictions_equal_a_separate_stage_fed_the_published_tracks(
    engine: Engine, frames: list[DriveFrame]
) -> None:
    """The composed pipeline and a separate prediction node run one stage on one input."""
    record = run(engine, frames)
    separate = PredictionStage(engine["predictor"])
    for frame, tracked, predicted in zip(frames, record.tracked, record.predicted, strict=True):
        assert tracked.tracks is not None
        got = separate.predict(tracked.tracks, frame.stamp_s, Pose2D(*frame.pose))
        np.testing.assert_array_equal(got.table(), predicted.output.table())


def test_sectors_give_the_tracks_and_predictions_of_whole_scans(
    engine: Engine, frames: list[DriveFrame]
) -> None:
    """Whole scans here are the sectors end to end, as a whole-scan driver sends them,
    stamped as the revolution is: by its last sector."""
    whole, counts = [], []
    for f in frames:
        parts = sensor_sectors(f.points, SECTORS)
        last = max(k for k, p in enumerate(parts) if p.shape[0])
        stamp = f.stamp_s + last * DRIVE.period_s / SECTORS
        whole.append(replace(f, points=np.concatenate(parts), stamp_s=stamp))
        counts.append(sum(p.shape[0] > 0 for p in parts))
    assert len(set(counts)) == 1 and counts[0] > 1
    streamed = run(engine, frames, per_revolution=counts[0])
    reference = run(engine, whole)
    assert len(streamed.near) == sum(counts) > len(frames)
    assert len(streamed.tracked) == len(reference.tracked) == len(frames)
    for got, want in zip(streamed.tracked, reference.tracked, strict=True):
        np.testing.assert_array_equal(got.obstacles, want.obstacles)
        assert got.tracks is not None and want.tracks is not None
        np.testing.assert_array_equal(got.tracks, want.tracks)
    for got_p, want_p in zip(streamed.predicted, reference.predicted, strict=True):
        np.testing.assert_array_equal(got_p.output.table(), want_p.output.table())


def test_speculation_changes_no_output_and_runs_twice_alike(
    engine: Engine, frames: list[DriveFrame]
) -> None:
    on = PredictionSettings(speculation=True)
    first, second = run(engine, frames, settings=on), run(engine, frames, settings=on)
    plain = run(engine, frames)
    for a, b, c in zip(first.predicted, second.predicted, plain.predicted, strict=True):
        np.testing.assert_array_equal(a.output.table(), b.output.table())
        np.testing.assert_array_equal(a.output.table(), c.output.table())


def test_without_tracking_the_full_cloud_is_the_last_result(
    engine: Engine, frames: list[DriveFrame]
) -> None:
    """The point cloud node's tiers: near field and full obstacles, nothing tracked."""
    record = run(engine, frames[:5], track=False)
    assert [kind for kind, _ in record.events] == ["near", "tracked"] * 5
    assert all(t.tracks is None and t.cloud is not None for t in record.tracked)
    assert sum(t.obstacles.shape[0] for t in record.tracked) > 5
