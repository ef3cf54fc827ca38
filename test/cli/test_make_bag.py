"""``dynshape-perception make-bag``: every source, both storage formats, real data."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dynshape_perception.cli.main import main
from dynshape_perception.io import bags
from dynshape_perception.io.pointcloud2 import cloud_to_points, cloud_to_table
from dynshape_perception.perception.records import OBSTACLE_DTYPE, TRACK_DTYPE
from dynshape_perception.tools.sim.drive import DriveConfig


def _topics(bag: Path) -> dict[str, tuple[str, int]]:
    with bags.BagReader(bag) as reader:
        return {t.name: (t.msgtype, t.count) for t in reader.topics()}


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_generated_drive(tmp_path: Path, storage: str, capsys: pytest.CaptureFixture[str]) -> None:
    bag = tmp_path / "drive"
    args = ["make-bag", "--source", "generated", "--out", str(bag), "--storage", storage]
    args += ["--frames", "4", "--segment-frames", "2", "--points", "5000:7000", "--vision-msgs"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert f"{bag} ({storage}): generated drive, seed 0, 4 frames" in out
    assert "points: 5000 to 7000" in out and "objects: 0 to 80" in out and "agents: 0 to 64" in out
    assert _topics(bag) == {
        "/points": (bags.POINTCLOUD2, 4),
        "/odom": (bags.ODOMETRY, 9),
        "/tf": (bags.TF_MESSAGE, 9),
        "/tf_static": (bags.TF_MESSAGE, 1),
        "/ground_truth": (bags.POINTCLOUD2, 4),
        "/detections": (bags.DETECTION3D_ARRAY, 4),
    }
    with bags.BagReader(bag) as reader:
        odom = [bags.odometry_pose(reader.deserialize(m)) for m in reader.messages(["/odom"])]
        scans = [reader.deserialize(m) for m in reader.messages(["/points"])]
        truth = [reader.deserialize(m) for m in reader.messages(["/ground_truth"])]
        tf = [bags.transforms_of(reader.deserialize(m)) for m in reader.messages(["/tf"])]
        (mount,) = bags.transforms_of(reader.deserialize(next(reader.messages(["/tf_static"]))))
    # The lidar above base_link; /tf moves base_link in odom as the odometry does.
    assert mount[:2] == ("base_link", "lidar")
    np.testing.assert_allclose(mount[3][:3, 3], [0.0, 0.0, DriveConfig().sensor_height_m])
    assert [(t[0][0], t[0][1], t[0][2]) for t in tf] == [("odom", "base_link", o[0]) for o in odom]
    np.testing.assert_allclose([t[0][3][0, 3] for t in tf], [o[1] for o in odom], atol=1e-9)
    stamps = [bags.stamp_ns(s.header.stamp) for s in scans]
    assert all(o[0] < s < p[0] for o, s, p in zip(odom[::2], stamps, odom[2::2], strict=False))
    assert [s.header.frame_id for s in scans] == ["lidar"] * 4
    want = np.geomspace(5000, 7000, 4).round().astype(int).tolist()
    assert sorted(cloud_to_points(s).xyzi.shape[0] for s in scans) == want
    assert odom[-1][1] > odom[0][1], "the ego drives forward"
    tables = [cloud_to_table(t, TRACK_DTYPE) for t in truth]
    assert sorted({t.shape[0] for t in tables}) == [0, 80]
    assert [bags.stamp_ns(t.header.stamp) for t in truth] == stamps


def test_same_seed_same_bytes_other_seed_other_bytes(tmp_path: Path) -> None:
    for name, seed in (("a", "7"), ("b", "7"), ("c", "8")):
        bag = tmp_path / name / "bag"
        args = ["make-bag", "--source", "generated", "--out", str(bag), "--seed", seed]
        assert main([*args, "--frames", "2", "--points", "5000:6000"]) == 0
    data = {
        n: [(f.name, f.read_bytes()) for f in sorted((tmp_path / n / "bag").iterdir())]
        for n in "abc"
    }
    assert data["a"] == data["b"]
    assert data["a"] != data["c"]


def test_crowd_detection_stream(tmp_path: Path) -> None:
    bag = tmp_path / "crowd"
    args = ["make-bag", "--source", "crowd", "--out", str(bag), "--storage", "sqlite3"]
    assert main([*args, "--frames", "12", "--agents", "9", "--vision-msgs"]) == 0
    topics = _topics(bag)
    assert topics["/obstacles"] == (bags.POINTCLOUD2, 12)
    assert topics["/detections"] == (bags.DETECTION3D_ARRAY, 12)
    with bags.BagReader(bag) as reader:
        messages = [reader.deserialize(m) for m in reader.messages(["/obstacles"])]
    stamps = np.array([bags.stamp_ns(m.header.stamp) for m in messages])
    assert set(np.diff(stamps).tolist()) == {400_000_000}, "2.5 Hz"
    rows = [cloud_to_table(m, OBSTACLE_DTYPE).shape[0] for m in messages]
    assert max(rows) <= 9 and min(rows) < max(rows)


def test_real_kitti_scan(tmp_path: Path, kitti_bin: Path) -> None:
    bag = tmp_path / "kitti"
    assert main(["make-bag", "--source", "kitti", "--out", str(bag), "--frames", "2"]) == 0
    with bags.BagReader(bag) as reader:
        scans = [reader.deserialize(m) for m in reader.messages(["/points"])]
    assert len(scans) == 2
    raw = np.fromfile(kitti_bin, dtype="<f4").reshape(-1, 4)
    assert np.array_equal(cloud_to_points(scans[0]).xyzi, raw)


def test_real_eth_scene(tmp_path: Path, eth_file: Path, capsys: pytest.CaptureFixture[str]) -> None:
    bag = tmp_path / "eth"
    assert main(["make-bag", "--source", "eth_ucy", "--out", str(bag), "--frames", "30"]) == 0
    out = capsys.readouterr().out
    assert "ETH/UCY biwi_eth.txt, 30 frames, 11.6 s" in out and "0.40 s" in out
    with bags.BagReader(bag) as reader:
        truth = [reader.deserialize(m) for m in reader.messages(["/ground_truth"])]
    first = cloud_to_table(truth[0], TRACK_DTYPE)
    lines = [ln.split() for ln in eth_file.read_text().splitlines() if ln.strip()]
    frame0 = min(float(f[0]) for f in lines if len(f) == 4 and f[0].replace(".", "").isdigit())
    want = sorted(
        (int(float(f[1])), float(f[2]), float(f[3]))
        for f in lines
        if len(f) == 4 and f[0].replace(".", "").isdigit() and float(f[0]) == frame0
    )
    got = sorted((int(r["id"]), float(r["x"]), float(r["y"])) for r in first)
    assert [g[0] for g in got] == [w[0] for w in want]
    np.testing.assert_allclose([g[1:] for g in got], [w[1:] for w in want], atol=1e-5)


def test_existing_output_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bag").mkdir()
    assert main(["make-bag", "--source", "crowd", "--out", str(tmp_path / "bag")]) == 2
    assert "exists already" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (["--source", "generated", "--seed", "-1"], "--seed must be an integer >= 0"),
        (["--source", "crowd", "--seed", "-1"], "--seed must be an integer >= 0"),
        (["--source", "generated", "--speed", "nan"], "--speed must be finite"),
        (["--source", "generated", "--speed", "inf"], "--speed must be finite"),
        (["--source", "generated", "--speed", "-2"], "--speed must be finite"),
    ],
)
def test_bad_seed_and_speed_exit_2(
    tmp_path: Path, extra: list[str], match: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["make-bag", *extra, "--frames", "1", "--out", str(tmp_path / "bag")]) == 2
    err = capsys.readouterr().err
    assert match in err and "Traceback" not in err
    assert not (tmp_path / "bag").exists()


def test_output_under_a_file_or_unwritable_folder_exits_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    for out in (blocker / "bag", Path("/proc/nope/bag")):
        assert main(["make-bag", "--source", "crowd", "--frames", "2", "--out", str(out)]) == 2
        assert "cannot create bag" in capsys.readouterr().err


ETH_ROWS = "".join(f"{780 + 10 * k}\t{p}.0\t{k + p}.5\t{p}.25\n" for k in range(8) for p in (1, 2))


@pytest.mark.parametrize("outlier", ["1e12\t1\t8.0\t3.0", "9007199254740000\t3\t1.0\t1.0"])
def test_eth_outlier_frame_is_refused_before_allocating(
    tmp_path: Path, outlier: str, capsys: pytest.CaptureFixture[str]
) -> None:
    scene = tmp_path / "scene.txt"
    scene.write_text(ETH_ROWS + outlier + "\n")
    args = ["make-bag", "--source", "eth_ucy", "--input", str(scene)]
    assert main([*args, "--out", str(tmp_path / "bag")]) == 2
    assert "outlier frame number" in capsys.readouterr().err
    assert not (tmp_path / "bag").exists()
    # Limited to the annotated stretch, the same file is fine.
    assert main([*args, "--frames", "8", "--out", str(tmp_path / "ok")]) == 0
    assert _topics(tmp_path / "ok")["/obstacles"][1] == 8


def test_eth_two_frames_far_apart_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scene = tmp_path / "scene.txt"
    scene.write_text("0\t1\t1.0\t1.0\n9007199254740000\t1\t2.0\t2.0\n")
    args = ["make-bag", "--source", "eth_ucy", "--input", str(scene), "--out", str(tmp_path / "b")]
    assert main(args) == 2
    assert "outlier frame number" in capsys.readouterr().err


def test_eth_ids_beyond_uint32_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scene = tmp_path / "scene.txt"
    scene.write_text(ETH_ROWS + "800\t4294967296\t1.0\t1.0\n")
    args = ["make-bag", "--source", "eth_ucy", "--input", str(scene), "--out", str(tmp_path / "b")]
    assert main(args) == 2
    assert "pedestrian ids above" in capsys.readouterr().err
