"""KITTI and ETH/UCY readers on the real files and on hand-made defective ones."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

from dynshape_perception.errors import DataError
from dynshape_perception.io.datasets import (
    KITTI_POINT_BYTES,
    read_eth_ucy,
    read_kitti_bin,
)

KITTI_000008_POINTS = 17_238


def test_kitti_real_scan(kitti_bin: Path) -> None:
    points = read_kitti_bin(kitti_bin)
    assert points.shape == (KITTI_000008_POINTS, 4)
    assert points.dtype == np.float32 and points.flags.c_contiguous
    assert np.isfinite(points).all()
    assert 0.0 <= points[:, 3].min() and points[:, 3].max() <= 1.0
    # Cropped to the camera's field of view: everything is in front of the sensor.
    assert points[:, 0].min() > 0.0
    # Most returns are ground, about 1.73 m below the sensor.
    assert -1.9 < np.median(points[points[:, 2] < -1.0, 2]) < -1.5


def test_kitti_round_trip(tmp_path: Path) -> None:
    expected = np.arange(40, dtype=np.float32).reshape(10, 4) / 7.0
    path = tmp_path / "scan.bin"
    expected.astype("<f4").tofile(path)
    np.testing.assert_array_equal(read_kitti_bin(path), expected)


def test_kitti_empty_file_is_zero_points(tmp_path: Path) -> None:
    path = tmp_path / "empty.bin"
    path.write_bytes(b"")
    assert read_kitti_bin(path).shape == (0, 4)


def test_kitti_truncated_scan_raises(tmp_path: Path, kitti_bin: Path) -> None:
    path = tmp_path / "truncated.bin"
    path.write_bytes(kitti_bin.read_bytes()[: 100 * KITTI_POINT_BYTES + 5])
    with pytest.raises(DataError, match=r"truncated\.bin.*not a multiple of 16"):
        read_kitti_bin(path)


def test_kitti_missing_file_raises(tmp_path: Path) -> None:
    with pytest.raises(DataError, match=r"missing\.bin"):
        read_kitti_bin(tmp_path / "missing.bin")


def test_eth_real_file_skips_its_one_defective_row(
    eth_file: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING):
        scene = read_eth_ucy(eth_file)
    # biwi_eth.txt has 5473 rows; row 151 holds five fields ("1100 12.0 8.9 888.42 7.42").
    assert scene.skipped_rows == 1
    assert scene.rows.shape == (5472, 4)
    warnings = [rec for rec in caplog.records if rec.levelno == logging.WARNING]
    assert len(warnings) == 1 and "skipped 1" in warnings[0].getMessage()
    assert not np.any(scene.rows[:, 2] > 100.0), "the defective row must not be mis-parsed"
    tracks = scene.tracks()
    assert len(tracks) == 360
    for frames, xy in tracks.values():
        assert np.all(np.diff(frames) > 0)
        assert xy.shape == (frames.size, 2)
        assert np.all(frames % 10 == 0)


def test_hotel_real_file_is_clean(hotel_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        scene = read_eth_ucy(hotel_file)
    assert scene.skipped_rows == 0 and not caplog.records
    assert scene.rows.shape == (6543, 4)
    tracks = scene.tracks()
    assert len(tracks) == 389
    step_speed = np.concatenate(
        [
            np.linalg.norm(np.diff(xy, axis=0), axis=1) / (np.diff(f) / 10 * 0.4)
            for f, xy in tracks.values()
        ]
    )
    assert 0.8 < np.median(step_speed) < 1.8


def test_eth_malformed_rows_are_counted(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "scene.txt"
    path.write_text(
        "\n".join(
            [
                "20\t1.0\t3.0\t4.0",
                "10\t1.0\t1.0\t2.0",
                "10\t2.0\t-1.5\t0.5",
                "10\t2.0\t1.0",  # three fields
                "10\t2.0\t1.0\t2.0\t9.0",  # five fields
                "10\tabc\t1.0\t2.0",  # not a number
                "10\t3.0\tnan\t2.0",
                "10\t3.0\t1.0\tinf",
                "10.5\t3.0\t1.0\t2.0",  # fractional frame
                "",
                "30 1 5.0 6.0",  # spaces instead of tabs are fine
            ]
        )
        + "\n"
    )
    with caplog.at_level(logging.WARNING):
        scene = read_eth_ucy(path)
    assert scene.skipped_rows == 6
    assert scene.path == path
    assert len([rec for rec in caplog.records if rec.levelno == logging.WARNING]) == 1
    assert "skipped 6" in caplog.records[0].getMessage()
    tracks = scene.tracks()
    assert sorted(tracks) == [1, 2]
    frames, xy = tracks[1]
    np.testing.assert_array_equal(frames, [10, 20, 30])
    np.testing.assert_array_equal(xy, [[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
    np.testing.assert_array_equal(tracks[2][1], [[-1.5, 0.5]])


def test_eth_empty_file(tmp_path: Path) -> None:
    path = tmp_path / "empty.txt"
    path.write_text("")
    scene = read_eth_ucy(path)
    assert scene.rows.shape == (0, 4) and scene.skipped_rows == 0
    assert scene.tracks() == {}


def test_eth_unreadable_file_raises(tmp_path: Path) -> None:
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(DataError, match=r"binary\.txt"):
        read_eth_ucy(binary)
    with pytest.raises(DataError, match=r"absent\.txt"):
        read_eth_ucy(tmp_path / "absent.txt")


def test_eth_near_integer_frames_and_ids_are_rounded(tmp_path: Path) -> None:
    path = tmp_path / "near.txt"
    path.write_text("10\t1\t1.0\t2.0\n19.9999999\t1\t1.5\t2.5\n30\t1.9999999\t3.0\t4.0\n")
    scene = read_eth_ucy(path)
    assert scene.skipped_rows == 0
    assert scene.frames.tolist() == [10, 20, 30]
    assert scene.ped_ids.tolist() == [1, 1, 2]
    assert sorted(scene.tracks()) == [1, 2]


@pytest.mark.parametrize("bad", ["1e19\t1", "9007199254740992\t1", "-10\t1", "10\t-1", "10\t1e300"])
def test_eth_frames_and_ids_out_of_range_are_malformed(tmp_path: Path, bad: str) -> None:
    path = tmp_path / "range.txt"
    path.write_text(f"10\t1\t1.0\t2.0\n{bad}\t8.0\t3.0\n20\t1\t1.5\t2.5\n")
    scene = read_eth_ucy(path)
    assert scene.skipped_rows == 1
    assert scene.frames.tolist() == [10, 20] and scene.ped_ids.tolist() == [1, 1]


def test_eth_duplicate_frame_and_id_keeps_the_first(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    path = tmp_path / "dup.txt"
    path.write_text("10\t1\t1.0\t2.0\n20\t1\t1.5\t2.5\n10\t1.0\t9.0\t9.0\n10\t2\t5.0\t5.0\n")
    with caplog.at_level(logging.WARNING):
        scene = read_eth_ucy(path)
    assert scene.skipped_rows == 1
    assert "skipped 1" in caplog.text and "repeat" in caplog.text
    frames, xy = scene.tracks()[1]
    assert frames.tolist() == [10, 20]
    np.testing.assert_array_equal(xy, [[1.0, 2.0], [1.5, 2.5]])
