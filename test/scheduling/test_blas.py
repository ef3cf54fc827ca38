"""NumPy's OpenBLAS and OpenCV threads: set while an executor runs, restored when it closes."""

from __future__ import annotations

import cv2
import pytest

from dynshape_perception.errors import ConfigError
from dynshape_perception.scheduling.blas import set_blas_threads, set_opencv_threads
from dynshape_perception.scheduling.executor import ExecutorOptions, TieredExecutor


def test_threads_are_set_and_the_previous_count_returned() -> None:
    before = set_blas_threads(1)
    if before is None:
        pytest.skip("NumPy is not linked against an OpenBLAS whose threads can be set")
    try:
        assert set_blas_threads(2) == 1
        assert set_blas_threads(1) == 2
    finally:
        set_blas_threads(before)


def test_an_executor_sets_blas_threads_while_it_runs() -> None:
    before = set_blas_threads(3)
    if before is None:
        pytest.skip("NumPy is not linked against an OpenBLAS whose threads can be set")
    try:
        executor = TieredExecutor(options=ExecutorOptions(blas_threads=1))
        assert executor.snapshot()["blas_threads"] == 1
        assert set_blas_threads(1) == 1
        executor.close()
        assert set_blas_threads(3) == 3
    finally:
        set_blas_threads(before)


def test_bad_thread_counts_are_refused() -> None:
    with pytest.raises(ConfigError, match="blas_threads must be >= 1"):
        ExecutorOptions(blas_threads=0)
    with pytest.raises(ConfigError, match="BLAS threads must be >= 1"):
        set_blas_threads(0)
    with pytest.raises(ConfigError, match="opencv_threads must be >= 1"):
        ExecutorOptions(opencv_threads=0)
    with pytest.raises(ConfigError, match="OpenCV threads must be >= 1"):
        set_opencv_threads(0)


def test_an_executor_sets_opencv_threads_while_it_runs() -> None:
    before = cv2.getNumThreads()
    try:
        cv2.setNumThreads(3)
        executor = TieredExecutor(options=ExecutorOptions(opencv_threads=1))
        assert executor.snapshot()["opencv_threads"] == 1
        assert cv2.getNumThreads() == 1
        executor.close()
        assert cv2.getNumThreads() == 3
    finally:
        cv2.setNumThreads(before)


def test_an_executor_not_asked_leaves_opencv_threads_alone() -> None:
    before = cv2.getNumThreads()
    try:
        cv2.setNumThreads(3)
        executor = TieredExecutor(options=ExecutorOptions())
        assert executor.snapshot()["opencv_threads"] is None
        assert cv2.getNumThreads() == 3
        executor.close()
    finally:
        cv2.setNumThreads(before)
