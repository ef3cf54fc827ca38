"""Tests of history resampling and packing."""

from __future__ import annotations

import numpy as np
import pytest

from dynshape_perception.errors import (
    BoundError,
    ConfigError,
    InputValueError,
    ShapeError,
)
from dynshape_perception.perception.prediction.history import pack_histories, resample_history

TRACKER_RATE_HZ = 10.0
VELOCITY_MPS = np.array([1.2, -0.7])
ORIGIN_M = np.array([3.0, 4.0])


def _linear_track(duration_s: float, start_s: float = 100.0) -> tuple[np.ndarray, np.ndarray]:
    stamps = start_s + np.arange(round(duration_s * TRACKER_RATE_HZ) + 1) / TRACKER_RATE_HZ
    xy = ORIGIN_M + (stamps - start_s)[:, None] * VELOCITY_MPS
    return stamps, xy


def test_10hz_linear_track_matches_analytic_positions() -> None:
    stamps, xy = _linear_track(10.0)
    out, length = resample_history(stamps, xy, num_steps=8, step_s=0.4)
    assert length == 8 and out.shape == (8, 2) and out.dtype == np.float32
    expected_t = stamps[-1] - 0.4 * np.arange(7, -1, -1)
    expected = ORIGIN_M + (expected_t - stamps[0])[:, None] * VELOCITY_MPS
    np.testing.assert_allclose(out, expected, atol=1e-4)
    np.testing.assert_allclose(out[-1], xy[-1], atol=1e-5)


def test_never_extrapolates_before_first_stamp() -> None:
    stamps, xy = _linear_track(1.0)
    out, length = resample_history(stamps, xy, num_steps=20)
    # 1.0 s of history holds samples at 0, -0.4, -0.8 s from the newest stamp only.
    assert length == 3 and out.shape == (3, 2)
    np.testing.assert_allclose(out[0], ORIGIN_M + 0.2 * VELOCITY_MPS, atol=1e-5)
    single, single_len = resample_history(stamps[:1], xy[:1], num_steps=5)
    assert single_len == 1
    np.testing.assert_allclose(single[0], xy[0])


def test_exact_span_keeps_sample_on_first_stamp() -> None:
    stamps, xy = _linear_track(2.8)
    _, length = resample_history(stamps, xy, num_steps=20)
    assert length == 8


def test_end_stamp_inside_span() -> None:
    stamps, xy = _linear_track(5.0)
    end = stamps[0] + 3.05
    out, length = resample_history(stamps, xy, num_steps=4, end_stamp_s=end)
    assert length == 4
    np.testing.assert_allclose(out[-1], ORIGIN_M + 3.05 * VELOCITY_MPS, atol=1e-4)
    with pytest.raises(InputValueError, match="never extrapolates"):
        resample_history(stamps, xy, num_steps=4, end_stamp_s=stamps[-1] + 0.5)


def test_bad_inputs_raise() -> None:
    stamps, xy = _linear_track(1.0)
    shuffled = stamps.copy()
    shuffled[[3, 4]] = shuffled[[4, 3]]
    with pytest.raises(InputValueError, match="strictly increasing"):
        resample_history(shuffled, xy, num_steps=4)
    repeated = stamps.copy()
    repeated[5] = repeated[4]
    with pytest.raises(InputValueError, match="strictly increasing"):
        resample_history(repeated, xy, num_steps=4)
    with pytest.raises(ShapeError):
        resample_history(stamps, xy[:-1], num_steps=4)
    with pytest.raises(ShapeError):
        resample_history(stamps[:0], xy[:0], num_steps=4)
    with pytest.raises(ConfigError):
        resample_history(stamps, xy, num_steps=0)
    with pytest.raises(ConfigError):
        resample_history(stamps, xy, num_steps=4, step_s=0.0)
    nan_xy = xy.copy()
    nan_xy[2, 0] = np.nan
    with pytest.raises(InputValueError, match="non-finite"):
        resample_history(stamps, nan_xy, num_steps=4)


def test_pack_histories_left_aligned() -> None:
    first = np.arange(6, dtype=np.float64).reshape(3, 2)
    second = np.ones((1, 2))
    hist, lengths = pack_histories([first, second], 4)
    assert hist.shape == (2, 4, 2) and hist.dtype == np.float32
    assert lengths.dtype == np.int32 and lengths.tolist() == [3, 1]
    np.testing.assert_array_equal(hist[0, :3], first)
    np.testing.assert_array_equal(hist[0, 3], [0.0, 0.0])
    np.testing.assert_array_equal(hist[1, 0], [1.0, 1.0])
    assert not hist[1, 1:].any()
    empty_hist, empty_lengths = pack_histories([], 4)
    assert empty_hist.shape == (0, 4, 2) and empty_lengths.shape == (0,)


def test_pack_histories_errors() -> None:
    with pytest.raises(BoundError, match="T=2"):
        pack_histories([np.zeros((3, 2))], 2)
    with pytest.raises(ShapeError):
        pack_histories([np.zeros((3, 3))], 4)
    with pytest.raises(ConfigError):
        pack_histories([np.zeros((3, 2))], 0)


def test_values_beyond_float32_or_of_the_wrong_kind_are_refused() -> None:
    stamps = np.array([0.0, 0.4, 0.8])
    huge = np.array([[1e300, 0.0], [0.0, 0.0], [0.0, 0.0]])
    with pytest.raises(InputValueError, match="float32 range"):
        resample_history(stamps, huge, num_steps=8)
    with pytest.raises(InputValueError, match="out-of-range"):
        pack_histories([np.array([[1e39, 0.0]])], 4)
    with pytest.raises(ShapeError, match="must hold numbers"):
        resample_history(stamps, np.array([["a", "b"]] * 3), num_steps=8)
    with pytest.raises(ShapeError, match="must hold numbers"):
        pack_histories([np.array([[True, False]])], 4)
    with pytest.raises(ConfigError, match="number of seconds"):
        resample_history(stamps, np.zeros((3, 2)), num_steps=8, step_s="0.4")  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="too small"):
        resample_history(stamps, np.zeros((3, 2)), num_steps=8, step_s=1e-320)
