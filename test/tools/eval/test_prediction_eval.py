"""Tests of the ETH/UCY prediction protocol, its baselines and metrics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dynshape_perception.errors import ConfigError, DataError, InputValueError, ShapeError
from dynshape_perception.perception.prediction.history import detect_frame_step
from dynshape_perception.tools.eval.prediction import (
    CV6_TURN_RAD,
    ade_fde,
    bootstrap_ci,
    calibration,
    constant_velocity,
    cv6,
    evaluate_prediction,
    extract_windows,
    min_ade_fde,
    ratio_ci,
)

FRAME_STEP = 10
RATIO_NAMES = {"top1_ADE/cv_ADE", "minADE/cv6_minADE", "minFDE/cv6_minFDE"}


def _line(frames: np.ndarray, velocity: tuple[float, float] = (0.5, 0.2)) -> np.ndarray:
    return np.asarray(velocity) * (frames / FRAME_STEP)[:, None] + np.array([1.0, -2.0])


def _scene() -> dict[int, tuple[np.ndarray, np.ndarray]]:
    gap = np.concatenate([np.arange(0, 260, FRAME_STEP), np.arange(300, 510, FRAME_STEP)])
    short = np.arange(0, 100, FRAME_STEP)
    exact = np.arange(1000, 1200, FRAME_STEP)
    return {
        7: (gap, _line(gap)),
        3: (short, _line(short)),
        5: (exact, _line(exact, (-0.3, 0.4))),
    }


def _cv6_predictor(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    probs = np.tile([0.5, 0.1, 0.1, 0.1, 0.1, 0.1], (obs.shape[0], 1))
    return cv6(obs), probs


def test_windows_count_with_gap() -> None:
    obs, fut = extract_windows(_scene())
    # id 3: 10 frames, none; id 5: exactly 20, one; id 7: runs of 26 and 21 frames, 7 + 2.
    assert obs.shape == (10, 8, 2) and fut.shape == (10, 12, 2)
    gap_frames = _scene()[7][0]
    exact_frames = _scene()[5][0]
    np.testing.assert_allclose(obs[0], _line(exact_frames[:8], (-0.3, 0.4)))
    np.testing.assert_allclose(obs[1], _line(gap_frames[:8]))
    np.testing.assert_allclose(fut[1], _line(gap_frames[8:20]))
    np.testing.assert_allclose(obs[-1], _line(gap_frames[-20:-12]))
    assert detect_frame_step(_scene()) == FRAME_STEP
    assert extract_windows(_scene(), frame_step=20)[0].shape[0] == 0


def test_windows_reject_bad_tracks() -> None:
    frames = np.array([0, 20, 10])
    with pytest.raises(InputValueError, match="strictly increasing"):
        extract_windows({1: (frames, np.zeros((3, 2)))})
    with pytest.raises(ShapeError):
        extract_windows({1: (np.arange(3), np.zeros((3, 3)))})
    with pytest.raises(InputValueError, match="whole numbers"):
        extract_windows({1: (np.array([0.0, 10.5]), np.zeros((2, 2)))})
    as_float = {pid: (frames.astype(np.float64), xy) for pid, (frames, xy) in _scene().items()}
    assert extract_windows(as_float)[0].shape[0] == 10
    with pytest.raises(DataError, match="frame step"):
        detect_frame_step({1: (np.array([5]), np.zeros((1, 2)))})


def test_constant_velocity_exact_on_straight_line() -> None:
    obs, fut = extract_windows(_scene())
    ade, fde = ade_fde(constant_velocity(obs), fut)
    assert ade.shape == fde.shape == (obs.shape[0],)
    np.testing.assert_allclose(ade, 0.0, atol=1e-12)
    np.testing.assert_allclose(fde, 0.0, atol=1e-12)


def test_cv6_hypotheses() -> None:
    obs = np.zeros((2, 8, 2))
    obs[:, :, 0] = np.arange(8) * 0.4
    obs[1] = obs[1] @ np.array([[0.0, 1.0], [-1.0, 0.0]])  # moving along +y instead
    hyps = cv6(obs)
    assert hyps.shape == (2, 6, 12, 2)
    np.testing.assert_allclose(hyps[:, 0], constant_velocity(obs))
    np.testing.assert_allclose(hyps[:, -1], np.repeat(obs[:, -1:], 12, axis=1))
    step = hyps[0, :, 0] - obs[0, -1]
    np.testing.assert_allclose(np.linalg.norm(step, axis=1), [0.4, 0.4, 0.4, 0.24, 0.52, 0.0])
    np.testing.assert_allclose(
        np.arctan2(step[1:3, 1], step[1:3, 0]), [CV6_TURN_RAD, -CV6_TURN_RAD]
    )
    assert np.arctan2(hyps[1, 1, 0, 1] - obs[1, -1, 1], hyps[1, 1, 0, 0] - obs[1, -1, 0]) == (
        pytest.approx(np.pi / 2 + CV6_TURN_RAD)
    )
    with pytest.raises(ShapeError):
        cv6(np.zeros((3, 1, 2)))


def test_ade_fde_and_min_of_k() -> None:
    fut = np.zeros((1, 12, 2))
    pred = np.zeros((1, 12, 2))
    pred[0, :, 0] = np.arange(1, 13)
    ade, fde = ade_fde(pred, fut)
    assert ade[0] == pytest.approx(6.5) and fde[0] == pytest.approx(12.0)
    # Hypothesis 0 is best on average, hypothesis 1 at the end: minima are taken separately.
    hyps = np.zeros((1, 2, 12, 2))
    hyps[0, 0, -1, 0] = 3.0
    hyps[0, 1, :, 0] = 1.0
    hyps[0, 1, -1, 0] = 0.0
    min_ade, min_fde = min_ade_fde(hyps, fut)
    assert min_ade[0] == pytest.approx(0.25) and min_fde[0] == pytest.approx(0.0)
    with pytest.raises(ShapeError):
        min_ade_fde(hyps[:, :, :5], fut)


def test_bootstrap_ci_contains_mean_and_is_seeded() -> None:
    values = np.random.default_rng(3).gamma(2.0, 0.3, size=400)
    lo, hi = bootstrap_ci(values, seed=1)
    assert lo < values.mean() < hi
    assert hi - lo < 0.2
    assert bootstrap_ci(values, seed=1) == (lo, hi)
    assert bootstrap_ci(values, seed=2) != (lo, hi)


def test_evaluate_prediction_report(
    prediction_keys: frozenset[str], prediction_metrics: frozenset[str]
) -> None:
    result = evaluate_prediction(_scene(), _cv6_predictor, seed=0)
    assert set(result) == prediction_keys
    assert set(result["ci95"]) == prediction_metrics
    assert set(result["ratios"]) == RATIO_NAMES
    json.dumps(result)
    assert result["windows"] == 10 and result["pedestrians"] == 2
    # Every error is zero: no ratio to a baseline without error.
    assert all(r == {"value": None, "ci95": None} for r in result["ratios"].values())
    assert result["calibration"]["best_share"] == 1.0
    assert result["cv_ADE"] == result["top1_ADE"] == 0.0
    assert result["minADE"] == result["cv6_minADE"] == 0.0
    assert type(result["minADE"]) is float and type(result["windows"]) is int
    batched = evaluate_prediction(_scene(), _cv6_predictor, seed=0, batch_size=3)
    assert batched == result


def test_evaluate_prediction_errors() -> None:
    with pytest.raises(DataError, match="no window"):
        evaluate_prediction({1: (np.arange(0, 50, 10), np.zeros((5, 2)))}, _cv6_predictor)
    with pytest.raises(ShapeError, match="predictor returned traj"):
        evaluate_prediction(_scene(), lambda o: (cv6(o)[:, :, :5], np.ones((o.shape[0], 6))))
    with pytest.raises(ShapeError, match="probs"):
        evaluate_prediction(_scene(), lambda o: (cv6(o), np.ones((o.shape[0], 5))))


def _read_scene(path: Path) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """A minimal ETH/UCY reader for this test: rows that are not four numbers are skipped."""
    rows: dict[int, list[tuple[int, float, float]]] = {}
    for line in path.read_text().splitlines():
        fields = line.split()
        if len(fields) != 4:
            continue
        try:
            frame, ped, x, y = (float(v) for v in fields)
        except ValueError:
            continue
        if np.isfinite([frame, ped, x, y]).all():
            rows.setdefault(int(ped), []).append((int(frame), x, y))
    scene = {}
    for ped, samples in rows.items():
        table = np.array(sorted(samples))
        scene[ped] = (table[:, 0].astype(np.int64), table[:, 1:])
    return scene


# Measured: ETH 362 windows, CV ADE/FDE 1.078/2.288, CV-6 minADE/FDE 0.631/1.102 (41.5 %);
# HOTEL 1197 windows, CV 0.319/0.614, CV-6 0.186/0.327 (41.7 %).
@pytest.mark.parametrize(("fixture", "expected_windows"), [("eth_file", 362), ("hotel_file", 1197)])
def test_real_scenes_cv6_beats_cv(
    fixture: str, expected_windows: int, request: pytest.FixtureRequest
) -> None:
    scene = _read_scene(request.getfixturevalue(fixture))
    assert detect_frame_step(scene) == FRAME_STEP
    result = evaluate_prediction(scene, _cv6_predictor, seed=0)
    assert result["windows"] == expected_windows
    assert result["minADE"] == result["cv6_minADE"] and result["top1_ADE"] == result["cv_ADE"]
    for ratio in result["ratios"].values():
        assert ratio == {"value": 1.0, "ci95": [1.0, 1.0]}
    ade_gain = 1.0 - result["cv6_minADE"] / result["cv_ADE"]
    fde_gain = 1.0 - result["cv6_minFDE"] / result["cv_FDE"]
    assert 0.30 <= ade_gain <= 0.50, ade_gain
    assert 0.30 <= fde_gain <= 0.60, fde_gain
    lo, hi = result["ci95"]["minADE"]
    assert lo <= result["minADE"] <= hi


@pytest.mark.parametrize("seed", [-1, 2**63, 1.5, True])
def test_evaluate_prediction_refuses_bad_seeds(seed: object) -> None:
    with pytest.raises(ConfigError, match="seed must be an integer >= 0"):
        evaluate_prediction(_scene(), _cv6_predictor, seed=seed)  # type: ignore[arg-type]


def test_bootstrap_by_pedestrian_is_wider_where_their_windows_agree() -> None:
    rng = np.random.default_rng(4)
    per_pedestrian = rng.gamma(2.0, 0.3, size=40)
    values = np.repeat(per_pedestrian, 10)  # ten overlapping windows of each pedestrian
    groups = np.repeat(np.arange(40), 10)
    lo_w, hi_w = bootstrap_ci(values, seed=0)
    lo_g, hi_g = bootstrap_ci(values, seed=0, groups=groups)
    assert lo_g < values.mean() < hi_g
    # Ten copies are no more information than one: the honest interval is ~sqrt(10) wider.
    assert (hi_g - lo_g) > 2.5 * (hi_w - lo_w)
    with pytest.raises(ShapeError, match="label every value"):
        bootstrap_ci(values, groups=groups[:-1])


def test_ratio_interval_is_paired_and_by_pedestrian() -> None:
    rng = np.random.default_rng(5)
    base = rng.gamma(2.0, 0.5, size=300)
    groups = rng.integers(0, 30, size=300)
    # Every window at 0.8 of its baseline: every resample's ratio is 0.8, however noisy.
    interval = ratio_ci(0.8 * base, base, groups)
    assert interval is not None
    lo, hi = interval
    assert lo == pytest.approx(0.8) and hi == pytest.approx(0.8)
    model = base * rng.uniform(0.6, 1.0, size=300)
    interval = ratio_ci(model, base, groups, seed=1)
    assert interval is not None
    lo, hi = interval
    assert lo < model.mean() / base.mean() < hi < 1.0
    assert ratio_ci(model, base, groups, seed=1) == (lo, hi)
    assert ratio_ci(model, np.zeros(300), groups) is None
    with pytest.raises(ShapeError):
        ratio_ci(model, base[:-1], groups)


def test_calibration_sets_the_top_probability_against_how_often_it_is_best() -> None:
    obs, fut = extract_windows(_scene())
    hyps = cv6(obs)  # hypothesis 0 is exact on these straight lines
    n = obs.shape[0]
    right = calibration(np.tile([0.55, 0.09, 0.09, 0.09, 0.09, 0.09], (n, 1)), hyps, fut)
    assert right["confidence"] == pytest.approx(0.55) and right["best_share"] == 1.0
    assert right["ece"] == pytest.approx(0.45)
    assert right["reliability"] == [
        {"bin": [0.5, 0.6], "windows": n, "confidence": 0.55, "best_share": 1.0}
    ]
    # Half the windows trust the stop hypothesis, which is never the best.
    probs = np.tile([0.9, 0.02, 0.02, 0.02, 0.02, 0.02], (n, 1))
    probs[::2] = [0.02, 0.02, 0.02, 0.02, 0.02, 0.9]
    mixed = calibration(probs, hyps, fut)
    assert mixed["best_share"] == 0.5 and mixed["confidence"] == pytest.approx(0.9)
    assert mixed["ece"] == pytest.approx(0.4)
    with pytest.raises(ShapeError):
        calibration(probs[:, :5], hyps, fut)
