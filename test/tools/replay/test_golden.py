"""Golden regression: outputs against stored expectations within declared tolerances."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dynshape_perception.errors import ConfigError
from dynshape_perception.io.objects import TrackStates
from dynshape_perception.perception.objects import REPLAY_NAMESPACE, ObjectParams, TrackUuids
from dynshape_perception.perception.prediction.paths import PredictedPaths
from dynshape_perception.perception.records import OBSTACLE_DTYPE, PREDICTION_DTYPE, TRACK_DTYPE
from dynshape_perception.tools.replay import golden
from dynshape_perception.tools.replay.golden import Tolerances
from dynshape_perception.tools.replay.rundir import FrameOutputs, RunRecorder

T0 = 1_700_000_000 * 1_000_000_000
Frames = list[list[np.ndarray]]


def _frames() -> Frames:
    rng = np.random.default_rng(0)
    out = []
    for k in range(4):
        obstacles = np.zeros(5, OBSTACLE_DTYPE)
        obstacles["x"], obstacles["y"] = rng.uniform(0, 40, 5), rng.uniform(-10, 10, 5)
        obstacles["num_points"] = rng.integers(5, 50, 5)
        tracks = np.zeros(3, TRACK_DTYPE)
        tracks["id"] = [1, 2, 3 + k]
        tracks["x"], tracks["vx"] = rng.normal(size=3), rng.normal(size=3)
        predictions = np.zeros(2 * 12, PREDICTION_DTYPE)
        predictions["id"] = 1
        predictions["k"] = np.repeat([0, 1], 12)
        predictions["step"] = np.tile(np.arange(12), 2)
        predictions["x"], predictions["prob"] = rng.normal(size=24), 0.5
        out.append([obstacles, tracks, predictions])
    return out


def _outputs(obstacles: np.ndarray, tracks: np.ndarray, predictions: np.ndarray) -> FrameOutputs:
    """The tables as a frame's outputs; the messages' extras (UUIDs, paths) made up."""
    n = tracks.shape[0]
    states = TrackStates(
        tracks,
        TrackUuids(REPLAY_NAMESPACE).of(tracks["id"]),
        np.ones(n, np.float32),
        np.zeros(n, np.uint32),
    )
    paths = PredictedPaths.empty(0.4)
    return FrameOutputs("base_link", "odom", obstacles, states, predictions, paths, ObjectParams())


def _record(run_dir: Path, frames: Frames) -> Path:
    with RunRecorder(run_dir) as recorder:
        for k, (obstacles, tracks, predictions) in enumerate(frames):
            ns = T0 + k * 100_000_000
            recorder.write_frame(ns, ns, _outputs(obstacles, tracks, predictions))
        recorder.finish({"frames": []}, "")
    return golden.output_bag_of(run_dir)


def test_identical_outputs_pass_and_perturbed_ones_fail(tmp_path: Path) -> None:
    frames = _frames()
    gold = golden.write_golden(_record(tmp_path / "ref", frames), tmp_path / "golden")
    report = golden.check_golden(_record(tmp_path / "same", frames), gold)
    assert report.passed and report.frames == 4 and report.differing == 0

    perturbed = [[t.copy() for t in f] for f in frames]
    perturbed[2][1]["x"][1] += 0.2  # track id 2 in frame 2
    perturbed[3][2]["prob"][5] += 0.004  # within the 0.01 tolerance
    perturbed[1][0] = perturbed[1][0][:4]  # one obstacle lost
    report = golden.check_golden(_record(tmp_path / "bad", perturbed), gold)
    text = report.text(gold)
    assert not report.passed and report.differing == 2
    assert "golden check FAILED: 2 of 4 frames differ" in text
    assert "id 2: x " in text and "(|diff| 0.2000 > 0.01)" in text
    assert "4 rows, expected 5 (count tolerance 0)" in text
    assert "t=0.100 s" in text and "t=0.200 s" in text and "prob" not in text


def test_declared_tolerances_are_used(tmp_path: Path) -> None:
    frames = _frames()
    gold = golden.write_golden(_record(tmp_path / "ref", frames), tmp_path / "golden")
    perturbed = [[t.copy() for t in f] for f in frames]
    perturbed[0][1]["vx"] += 0.05
    perturbed[0][0]["num_points"] += 1
    out = _record(tmp_path / "bad", perturbed)
    text = golden.check_golden(out, gold).text(gold)
    assert "vx" in text and "num_points" in text
    (gold / "tolerances.yaml").write_text("velocity_mps: 0.1\nexact_num_points: false\n")
    assert golden.check_golden(out, gold).passed
    golden.write_golden(out, gold)
    assert Tolerances.load(gold / "tolerances.yaml").velocity_mps == 0.1, "tolerances are kept"


def test_missing_and_extra_frames(tmp_path: Path) -> None:
    frames = _frames()
    gold = golden.write_golden(_record(tmp_path / "ref", frames[:3]), tmp_path / "golden")
    text = golden.check_golden(_record(tmp_path / "more", frames), gold).text(gold)
    assert "not in the golden expectations" in text
    text = golden.check_golden(_record(tmp_path / "less", frames[:2]), gold).text(gold)
    assert "missing from the output" in text


def test_bad_golden_folders(tmp_path: Path) -> None:
    out = _record(tmp_path / "ref", _frames())
    with pytest.raises(ConfigError, match="--write-golden"):
        golden.check_golden(out, tmp_path / "nothing")
    gold = golden.write_golden(out, tmp_path / "golden")
    (gold / "tolerances.yaml").write_text("position: 1\n")
    with pytest.raises(ConfigError, match="unknown tolerances"):
        golden.check_golden(out, gold)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("5\n", "must be a mapping"),
        ("[[1]]\n", "must be a mapping"),
        ("position_m: .nan\n", "position_m must be a finite number >= 0"),
        ("position_m: .inf\n", "position_m must be a finite number >= 0"),
        ("position_m: abc\n", "position_m must be a finite number >= 0"),
        ("position_m: -0.1\n", "position_m must be a finite number >= 0"),
        ("prob: true\n", "prob must be a finite number >= 0"),
        ("count: 1.5\n", "count must be an integer >= 0"),
        ("count: -1\n", "count must be an integer >= 0"),
        ("exact_num_points: 'false'\n", "exact_num_points must be true or false"),
    ],
)
def test_bad_tolerances(tmp_path: Path, text: str, message: str) -> None:
    out = _record(tmp_path / "ref", _frames())
    gold = golden.write_golden(out, tmp_path / "golden")
    (gold / "tolerances.yaml").write_text(text)
    with pytest.raises(ConfigError, match=message):
        golden.check_golden(out, gold)


def test_non_finite_values_differ_from_finite_ones() -> None:
    want = np.zeros(2, TRACK_DTYPE)
    want["id"], want["x"] = [1, 2], [1.0, 2.0]
    for bad in (np.nan, np.inf):
        got = want.copy()
        got["x"][0] = bad
        (problem,) = golden.compare_frame("/tracks", got, want, Tolerances())
        assert problem.startswith("id 1: x ") and "expected 1.0000" in problem
        (problem,) = golden.compare_frame("/tracks", want, got, Tolerances())
        assert problem.startswith("id 1: x ")
        assert not golden.compare_frame("/tracks", got, got.copy(), Tolerances())
    got = want.copy()
    got["x"][0], want["x"][0] = np.inf, -np.inf
    assert len(golden.compare_frame("/tracks", got, want, Tolerances())) == 1
    yaw = np.zeros(1, OBSTACLE_DTYPE)
    nan_yaw = yaw.copy()
    nan_yaw["yaw"] = np.nan
    assert any(
        "yaw nan" in p for p in golden.compare_frame("/obstacles", nan_yaw, yaw, Tolerances())
    )


def test_a_nan_obstacle_is_reported_not_raised() -> None:
    want = np.zeros(3, OBSTACLE_DTYPE)
    want["x"], want["y"] = [1.0, 5.0, 9.0], [0.0, 1.0, 2.0]
    got = want.copy()
    got["x"][1] = np.nan
    problems = golden.compare_frame("/obstacles", got, want, Tolerances())
    assert len(problems) == 1 and "x nan, expected 5.0000" in problems[0]
    got["y"][:] = np.nan
    assert len(golden.compare_frame("/obstacles", got, want, Tolerances())) == 4
