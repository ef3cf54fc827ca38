"""The one-pass check of a message's rows finds a problem exactly where the per-column one does."""

from __future__ import annotations

import numpy as np
import pytest

from dynshape_perception.io.objects import _all_usable, _problems_by_column, row_problems
from dynshape_perception.perception.records import OBSTACLE_DTYPE, TRACK_DTYPE

BAD_VALUES = (np.nan, np.inf, -np.inf, 0.0, -1.0)


def _rows(dtype: np.dtype, n: int, rng: np.random.Generator) -> np.ndarray:
    table = np.zeros(n, dtype)
    for name in dtype.names or ():
        if dtype[name].kind == "f":
            table[name] = rng.uniform(0.1, 5.0, n)
        else:
            table[name] = rng.integers(0, 2**20, n)
    return table


@pytest.mark.parametrize("dtype", [OBSTACLE_DTYPE, TRACK_DTYPE], ids=["obstacles", "tracks"])
def test_rows_with_a_problem_are_those_the_columns_tell(dtype: np.dtype) -> None:
    rng = np.random.default_rng(7)
    floats = [n for n in dtype.names or () if dtype[n].kind == "f"]
    clean = 0
    for trial in range(300):
        table = _rows(dtype, int(rng.integers(0, 40)), rng)
        for _ in range(int(rng.integers(0, 3)) if table.size else 0):
            table[str(rng.choice(floats))][rng.integers(0, table.size)] = rng.choice(BAD_VALUES)
        want = _problems_by_column(table, "object")
        assert row_problems(table, "object") == want, trial
        assert _all_usable(table) == (not want), trial
        clean += not want
    # Both kinds came up: the one-pass answer was taken, and refused.
    assert 0 < clean < 300


def test_a_zero_box_size_or_a_nan_anywhere_is_found() -> None:
    table = _rows(TRACK_DTYPE, 5, np.random.default_rng(1))
    table["width"][1] = 0.0
    table["vy"][3] = np.nan
    problems = row_problems(table, "tracked object")
    assert sorted(problems) == [1, 3]
    assert "width 0.0" in problems[1] and "vy nan" in problems[3]


def test_integers_whose_bits_read_as_nan_are_no_problem() -> None:
    table = _rows(TRACK_DTYPE, 4, np.random.default_rng(2))
    table["id"][2] = 0x7FC00000  # a quiet NaN's bits
    table["num_points"][0] = 0xFF800000  # minus infinity's
    assert row_problems(table, "tracked object") == {}
    table["score"][3] = np.nan
    assert sorted(row_problems(table, "tracked object")) == [3]


def test_rows_that_are_no_float_matrix_take_the_columns() -> None:
    rng = np.random.default_rng(3)
    table = _rows(OBSTACLE_DTYPE, 10, rng)
    table["x"][4] = np.inf
    strided = table[::2]
    wide = np.zeros(3, np.dtype([("x", "<f8"), ("length", "<f8")]))
    wide["length"] = [1.0, 0.0, 2.0]
    for rows in (strided, wide):
        assert not _all_usable(rows)
        assert row_problems(rows, "object") == _problems_by_column(rows, "object")
    assert sorted(row_problems(strided, "object")) == [2]
    assert sorted(row_problems(wide, "object")) == [1]
