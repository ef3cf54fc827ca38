"""Bad input gets a clear package error naming the tensor and the expected shape."""

from __future__ import annotations

import numpy as np
import pytest

from dynshape_perception.errors import DynshapeError, InputValueError, ShapeError
from dynshape_perception.models import model_definition

SEG = model_definition("segmenter").spec
ASSOC = model_definition("associator").spec
PRED = model_definition("predictor").spec
GROUND = np.array([0, 0, 1, 1.73], np.float32)


def test_wrong_rank_names_tensor_and_shape() -> None:
    with pytest.raises(ShapeError, match=r"points has rank 1, expected \[P, 4\] float32"):
        SEG.bind_dims("forward", [np.zeros(4, np.float32), GROUND])


def test_wrong_dtype() -> None:
    with pytest.raises(ShapeError, match=r"points has dtype float64, expected \[P, 4\] float32"):
        SEG.bind_dims("forward", [np.zeros((3, 4)), GROUND])


def test_wrong_feature_width() -> None:
    with pytest.raises(ShapeError, match=r"detections has width 7 on axis 1, expected \[N, 8\]"):
        ASSOC.bind_dims("forward", [np.zeros((2, 7), np.float32), np.zeros((2, 8), np.float32)])


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_values(bad: float) -> None:
    points = np.zeros((5, 4), np.float32)
    points[3, 2] = bad
    with pytest.raises(InputValueError, match="points holds NaN or Inf"):
        SEG.bind_dims("forward", [points, GROUND])


def test_a_masked_array_is_refused_since_its_mask_hides_nan() -> None:
    points = np.ma.masked_invalid(np.array([[0, 0, 0, 0], [np.nan, 0, 0, 0]], np.float32))
    with pytest.raises(ShapeError, match="points is a masked array"):
        SEG.bind_dims("forward", [points, GROUND])


def test_profile_signatures_are_checked_against_the_spec() -> None:
    assert ASSOC.check_signature("forward", {"N": 3, "M": 4}) is None
    assert "no function" in str(ASSOC.check_signature("backward", {"N": 3, "M": 4}))
    assert "has dims" in str(ASSOC.check_signature("forward", {"N": 3}))
    assert "outside [0, 128]" in str(ASSOC.check_signature("forward", {"N": 129, "M": 4}))
    assert "outside" in str(ASSOC.check_signature("forward", {"N": -1, "M": 4}))


def test_count_above_bound() -> None:
    det = np.zeros((129, 8), np.float32)
    with pytest.raises(ShapeError, match=r"detections has N=129, above its bound 128"):
        ASSOC.bind_dims("forward", [det, np.zeros((0, 8), np.float32)])


def test_inconsistent_dims_between_inputs() -> None:
    hist = np.zeros((3, 5, 2), np.float32)
    with pytest.raises(ShapeError, match="lengths has A=2 on axis 0, but another input has A=3"):
        PRED.bind_dims("forward", [hist, np.ones(2, np.int32)])


def test_wrong_tensor_count() -> None:
    with pytest.raises(ShapeError, match="takes 2 tensors, got 1"):
        SEG.bind_dims("forward", [np.zeros((1, 4), np.float32)])


@pytest.mark.parametrize("lengths", [[0, 3], [3, 6]])
def test_predictor_lengths_outside_history(lengths: list[int]) -> None:
    arrays = [np.zeros((2, 5, 2), np.float32), np.asarray(lengths, np.int32)]
    dims = PRED.bind_dims("forward", arrays)
    with pytest.raises(InputValueError, match=r"lengths must lie in \[1, T=5\]"):
        PRED.check_values("forward", arrays, dims)


@pytest.mark.parametrize(
    ("lengths", "match"),
    [
        ([2, 0, 4], "packed lengths must be >= 1, got 0"),
        ([2, 2, 2], "sum to 6, but the rows are S=7"),
    ],
)
def test_packed_lengths_must_cover_every_row(lengths: list[int], match: str) -> None:
    arrays = [np.zeros((7, 2), np.float32), np.asarray(lengths, np.int32)]
    dims = PRED.bind_dims("encode_packed", arrays)
    with pytest.raises(InputValueError, match=match):
        PRED.check_values("encode_packed", arrays, dims)
    PRED.check_values("encode_packed", [arrays[0], np.asarray([2, 1, 4], np.int32)], dims)


def test_every_count_and_packed_input_of_any_model_is_checked() -> None:
    """The rules live in the specs, so no model is checked by name."""
    ruled = {
        (name, fn.name, t.name)
        for name in ("segmenter", "associator", "predictor")
        for fn in model_definition(name).spec.functions
        for t in fn.inputs
        if t.count_of or t.sums_to
    }
    assert ruled == {
        ("predictor", "forward", "lengths"),
        ("predictor", "encode", "lengths"),
        ("predictor", "encode_packed", "lengths"),
    }


def test_errors_share_the_package_base() -> None:
    assert issubclass(ShapeError, DynshapeError) and issubclass(InputValueError, DynshapeError)


def test_zero_counts_are_valid() -> None:
    assert SEG.bind_dims("forward", [np.zeros((0, 4), np.float32), GROUND]) == {"P": 0}
    dims = ASSOC.bind_dims("forward", [np.zeros((0, 8), np.float32), np.zeros((5, 8), np.float32)])
    assert dims == {"N": 0, "M": 5}


def test_a_signature_of_fewer_packed_rows_than_agents_is_no_call() -> None:
    """Each packed history has at least one step: S rows hold at most S agents."""
    assert PRED.check_signature("encode_packed", {"A": 3, "S": 3}) is None
    assert PRED.check_signature("encode_packed", {"A": 0, "S": 0}) is None
    problem = PRED.check_signature("encode_packed", {"A": 3, "S": 2})
    assert problem is not None and "S=2 rows cannot hold 3 lengths" in problem
