"""``dynshape-perception replay`` in process: determinism, run directories, bad and real bags."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dynshape_perception.cli import replay as replay_cli
from dynshape_perception.cli.main import main
from dynshape_perception.errors import DataError
from dynshape_perception.io import bags
from dynshape_perception.io.bags import DETECTION3D_ARRAY
from dynshape_perception.io.objects import (
    DETECTED_OBJECTS,
    obstacles_from_detected_objects,
    predictions_from_predicted_objects,
    tracks_from_tracked_objects,
)
from dynshape_perception.io.pointcloud2 import cloud_to_table
from dynshape_perception.models import MODEL_NAMES, model_definition
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import init_weights, save_weights
from dynshape_perception.perception import scan
from dynshape_perception.perception.records import OBSTACLE_DTYPE, TRACK_DTYPE
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.runtime.policy import JitConfig
from dynshape_perception.tools.replay import sources
from dynshape_perception.tools.replay.params import load_params_file
from dynshape_perception.tools.replay.settings import ReplaySettings
from dynshape_perception.tools.sim.drive import DriveConfig

REAL_BAGS = ("mcap_talker", "sqlite3_talker", "mcap_cdr_test", "sqlite3_cdr_test")
DRIVE = DriveConfig(seed=2, frames=6, segment_frames=3, points_range=(5_000, 8_000))


@pytest.fixture(scope="module")
def weights_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Deterministic initial weights, so that results do not follow refits of models/."""
    directory = tmp_path_factory.mktemp("weights")
    for name in MODEL_NAMES:
        weights = init_weights(parameter_shapes(model_definition(name)), seed=0)
        save_weights(name, weights, {"version": "test-init"}, directory)
    return directory


@pytest.fixture(scope="module")
def drive_bag(tmp_path_factory: pytest.TempPathFactory) -> Path:
    bag = tmp_path_factory.mktemp("bags") / "drive"
    sources.write_generated(bag, "mcap", DRIVE)
    return bag


@pytest.fixture(scope="module")
def engine(weights_dir: Path, cache_root: Path) -> Iterator[Engine]:
    with Engine(
        "x86_64", JitConfig(mode="off"), cache_dir=cache_root, weights_dir=weights_dir
    ) as e:
        yield e


@pytest.fixture
def engine_args(
    weights_dir: Path, cache_root: Path, engine: Engine, monkeypatch: pytest.MonkeyPatch
) -> list[str]:
    """CLI arguments for the test weights; the engine is built once per module (seconds each)."""

    def shared(settings: ReplaySettings, cache_dir: Path | None, weights: Path | None) -> Engine:
        assert settings.jit.mode == "off" and (cache_dir, weights) == (cache_root, weights_dir)
        return engine

    monkeypatch.setattr(replay_cli, "build_engine", shared)
    return ["--weights-dir", str(weights_dir), "--cache-dir", str(cache_root), "--no-progress"]


def _files(bag: Path) -> dict[str, bytes]:
    return {f.name: f.read_bytes() for f in sorted(bag.iterdir())}


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_two_replays_record_identical_outputs(
    tmp_path: Path,
    drive_bag: Path,
    weights_dir: Path,
    cache_root: Path,
    engine: Engine,
    monkeypatch: pytest.MonkeyPatch,
    storage: str,
) -> None:
    """The first run builds its own engine (mcap case); the second reuses a warm one."""
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        if run.name == "b" or storage == "sqlite3":
            monkeypatch.setattr(replay_cli, "build_engine", lambda *_: engine)
        code = main(
            [
                *("replay", str(drive_bag), "--record", str(run), "--storage", storage),
                *("--weights-dir", str(weights_dir), "--cache-dir", str(cache_root)),
            ]
        )
        assert code == 0
    first, second = (_files(run / "output") for run in runs)
    assert first == second
    assert len(first) == 2 and sum(len(b) for b in first.values()) > 10_000
    with bags.BagReader(runs[0] / "output") as reader:
        counts = {t.name: t.count for t in reader.topics()}
    assert counts == {
        "/obstacles": 6,
        "/predictions": 6,
        "/tracks": 6,
        "/detected_objects": 6,
        "/tracked_objects": 6,
        "/predicted_objects": 6,
    }
    metrics = [json.loads((run / "metrics.json").read_text()) for run in runs]
    assert [f["stamp_ns"] for f in metrics[0]["frames"]] == [
        f["stamp_ns"] for f in metrics[1]["frames"]
    ]


def _recorded(bag: Path) -> dict[str, list[Any]]:
    with bags.BagReader(bag) as reader:
        out: dict[str, list[Any]] = {}
        for message in reader.messages():
            out.setdefault(message.topic, []).append(reader.deserialize(message))
    return out


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_standard_object_messages_round_trip_through_make_bag_and_replay(
    tmp_path: Path, engine_args: list[str], storage: str
) -> None:
    """A crowd bag through make-bag and replay --record: DetectedObjects, TrackedObjects and
    PredictedObjects come back from the bag as the tables of the same frames say."""
    bag, run = tmp_path / "crowd", tmp_path / "run"
    made = ["make-bag", "--source", "crowd", "--out", str(bag), "--storage", storage]
    assert main([*made, "--frames", "12", "--agents", "3", "--vision-msgs"]) == 0
    with bags.BagReader(bag) as reader:
        assert {t.name: t.msgtype for t in reader.topics()}["/detections"] == DETECTION3D_ARRAY
    code = main(["replay", str(bag), "--record", str(run), "--storage", storage, *engine_args])
    assert code == 0
    got = _recorded(run / "output")
    assert {m.__msgtype__ for m in got["/detected_objects"]} == {DETECTED_OBJECTS}
    uuid_of: dict[int, bytes] = {}
    predicted_agents = 0
    for obstacles, detected, tracks, tracked, predicted in zip(
        got["/obstacles"],
        got["/detected_objects"],
        got["/tracks"],
        got["/tracked_objects"],
        got["/predicted_objects"],
        strict=True,
    ):
        assert detected.header == obstacles.header and tracked.header == tracks.header
        assert tracked.header.frame_id == predicted.header.frame_id == "world"
        table = cloud_to_table(obstacles, OBSTACLE_DTYPE)
        back = obstacles_from_detected_objects(detected)
        np.testing.assert_allclose(back["x"], table["x"], atol=1e-6)
        assert back["label"].tolist() == table["label"].tolist()
        track_table = cloud_to_table(tracks, TRACK_DTYPE)
        states = tracks_from_tracked_objects(tracked)
        np.testing.assert_allclose(states.tracks["y"], track_table["y"], atol=1e-6)
        np.testing.assert_allclose(states.tracks["vx"], track_table["vx"], atol=1e-5)
        assert ((states.existence > 0.0) & (states.existence < 1.0)).all()
        for track_id, uuid in zip(track_table["id"].tolist(), states.uuids, strict=True):
            assert uuid_of.setdefault(track_id, bytes(uuid)) == bytes(uuid), "a UUID changed"
        for obj in predictions_from_predicted_objects(predicted):
            if obj.paths:
                predicted_agents += 1
                assert obj.confidences.sum() == pytest.approx(1.0, abs=1e-5)
                assert obj.time_steps_s == [0.4] * len(obj.paths)
    assert len(uuid_of) >= 3 and len(set(uuid_of.values())) == len(uuid_of)
    assert predicted_agents > 0


FEATURES = (
    "/**:\n  ros__parameters:\n"
    "    points:\n      sectors_per_revolution: 0\n"
    "    prediction:\n      mode: incremental\n      speculation: true\n"
    # The shortest window: histories restart within the bag's frames.
    "      history_steps: 2\n"
)


def test_replay_with_every_feature_on_records_identical_outputs(
    tmp_path: Path, engine_args: list[str]
) -> None:
    """Sector clouds (their count detected), incremental prediction and speculation, twice."""
    bag = tmp_path / "sectors"
    sectors = 6
    drive = replace(DRIVE, frames=12, segment_frames=12)
    sources.write_generated(bag, "mcap", drive, sectors=sectors)
    config = tmp_path / "features.yaml"
    config.write_text(FEATURES)
    runs = [tmp_path / "a", tmp_path / "b"]
    for run in runs:
        args = ["replay", str(bag), "--config", str(config), "--record", str(run)]
        assert main([*args, *engine_args]) == 0
    first, second = (_files(run / "output") for run in runs)
    assert first == second
    with bags.BagReader(runs[0] / "output") as reader:
        counts = {t.name: t.count for t in reader.topics()}
    # The first revolution ends when the second begins, the others with their last sector.
    assert set(counts.values()) == {12} and {"/predicted_objects", "/predictions"} <= set(counts)
    doc = json.loads((runs[0] / "metrics.json").read_text())
    near = [f for f in doc["frames"] if "near_field" in f["latency_ms"]]
    assert len(near) == len(doc["frames"]) > 12 * 2
    assert sum(f["counts"].get("predictions", 0) for f in doc["frames"]) > 0
    stage = doc["summary"]["prediction_stage"]
    assert stage["mode"] == "incremental" and stage["speculation"] is True
    assert stage["frames"] == 12 and stage["speculation.candidates"] > 0
    assert stage["slid"] > 0
    assert doc["summary"]["sectors"]["revolutions"] == 12


def test_run_directory_holds_metrics_and_parameters(
    tmp_path: Path, drive_bag: Path, engine_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "params.yaml"
    config.write_text(
        "/**:\n  ros__parameters:\n    segmentation:\n      cell_size_m: 0.2\n"
        "    tiers:\n      collision_deadline_ms: 50.0\n    markers:\n      box_alpha: 0.3\n"
        "    my_driver_option: 3\n"
    )
    run = tmp_path / "run"
    code = main(
        ["replay", str(drive_bag), "--config", str(config), "--record", str(run), *engine_args]
    )
    captured = capsys.readouterr()
    assert code == 0
    assert "parameter my_driver_option is not used by replay" in captured.err
    assert "deadline misses tier 1:" in captured.out
    doc = json.loads((run / "metrics.json").read_text())
    assert doc["run"]["deterministic"] is True and doc["run"]["jit"] == "off"
    # The nodes' tier model: tier 1 the near field, tier 2 the full cloud and tracking.
    assert doc["tiers"]["1"] == {"deadline_ms": 50.0, "stages": ["near_field"]}
    assert doc["tiers"]["2"]["stages"] == ["segment", "cluster", "track"]
    assert len(doc["frames"]) == 6
    for frame in doc["frames"]:
        stages = {"near_field", "segment", "cluster", "track", "predict", "total"}
        assert set(frame["latency_ms"]) == stages
        assert set(frame["completion_ms"]) == {"1", "2", "3"}
        # Every point of the scan is segmented or counted where the crop left it out.
        crop = sum(frame["counts"][key] for key in scan.COUNTERS)
        assert frame["counts"]["points"] + crop >= 5_000 and frame["counts"]["points"] > 0
        # A frame with nothing that could join a cluster calls no segmenter.
        assert frame["jit_calls"] >= 0 and frame["hit_rate"] == 0.0
        missed_1 = frame["completion_ms"]["1"] > 50.0
        assert (1 in frame["missed"]) == missed_1
    assert sum(frame["jit_calls"] for frame in doc["frames"]) > 0
    summary = doc["summary"]
    assert summary["frames"] == 6 and set(summary["deadline_misses"]) == {"1", "2", "3", "4"}
    assert summary["drops"] == {"1": 0, "2": 0, "3": 0, "4": 0}
    assert "prediction" in summary and doc["compile_events"] == []
    used = load_params_file(run / "params.yaml")
    assert used["segmentation.cell_size_m"] == 0.2
    assert used["tiers.collision_deadline_ms"] == 50.0
    assert used["tiers.best_effort_deadline_ms"] == 5000.0
    assert used["tracking.gate_distance_m"] == 2.0 and used["jit.mode"] == "off"
    assert used["my_driver_option"] == 3
    assert sorted(p.name for p in tmp_path.iterdir()) == ["params.yaml", "run"]


def test_golden_check_passes_then_fails_on_perturbed_output(
    tmp_path: Path, drive_bag: Path, engine_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    gold = tmp_path / "golden"
    assert main(["replay", str(drive_bag), "--write-golden", str(gold), *engine_args]) == 0
    assert (gold / "expected" / "metadata.yaml").is_file()
    assert "position_m" in (gold / "tolerances.yaml").read_text()
    capsys.readouterr()
    assert main(["replay", str(drive_bag), "--check", str(gold), *engine_args]) == 0
    assert "golden check passed: 6 frames" in capsys.readouterr().out
    perturbed = tmp_path / "perturbed.yaml"
    perturbed.write_text("/**:\n  ros__parameters:\n    segmentation:\n      cell_size_m: 0.3\n")
    code = main(
        ["replay", str(drive_bag), "--config", str(perturbed), "--check", str(gold), *engine_args]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "golden check FAILED" in out and "frames differ" in out
    assert "/obstacles:" in out and "expected" in out and "stamp" in out


def test_truncated_bag_exits_2_naming_the_file_without_traceback(
    tmp_path: Path, drive_bag: Path, weights_dir: Path, cache_root: Path
) -> None:
    bag = tmp_path / "broken"
    shutil.copytree(drive_bag, bag)
    data = bag / "drive.mcap"
    data.write_bytes(data.read_bytes()[:-5000])
    run = tmp_path / "out" / "run"
    env = {**os.environ, "DYNSHAPE_CACHE_DIR": str(cache_root)}
    proc = subprocess.run(
        [
            *(sys.executable, "-m", "dynshape_perception.cli.main", "replay", str(bag)),
            *("--record", str(run), "--weights-dir", str(weights_dir)),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr + proc.stdout
    assert f"error: cannot open bag {bag}: it is corrupt or truncated" in proc.stderr
    assert not run.exists() and not (tmp_path / "out").exists()


def test_a_damaged_chunk_of_a_make_bag_output_exits_2_naming_file_and_offset(
    tmp_path: Path, engine_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    bag = tmp_path / "made"
    made = ["make-bag", "--source", "generated", "--out", str(bag), "--frames", "3"]
    assert main([*made, "--points", "20000:30000"]) == 0
    data = bag / "made.mcap"
    raw = bytearray(data.read_bytes())
    middle = len(raw) // 2
    raw[middle : middle + 64] = bytes(b ^ 0xFF for b in raw[middle : middle + 64])
    data.write_bytes(bytes(raw))
    capsys.readouterr()
    run = tmp_path / "run"
    assert main(["replay", str(bag), "--record", str(run), *engine_args]) == 2
    captured = capsys.readouterr()
    assert "frames 3" not in captured.out
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert f"{data} is damaged: the chunk at byte offset " in captured.err
    assert "does not match its CRC" in captured.err
    assert not run.exists()


def test_corruption_found_mid_replay_leaves_nothing(
    tmp_path: Path, engine_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    bag = tmp_path / "sq"
    sources.write_generated(bag, "sqlite3", DRIVE)
    db = bag / "sq.db3"
    raw = bytearray(db.read_bytes())
    page = 4096
    broken = False
    # Damage pages from the back until one breaks reading after some messages were read.
    for start in range(len(raw) - 4 * page, 2 * page, -page):
        trial = bytearray(raw)
        trial[start : start + page] = bytes((i * 7 + 13) % 256 for i in range(page))
        db.write_bytes(bytes(trial))
        read = 0
        try:
            with bags.BagReader(bag) as reader:
                for _ in reader.messages():
                    read += 1
        except DataError:
            if read > 3:
                broken = True
                break
    assert broken, "no page damage that fails mid-read was found"
    run = tmp_path / "runs" / "run"
    run.parent.mkdir()
    code = main(["replay", str(bag), "--record", str(run), *engine_args])
    err = capsys.readouterr().err
    assert code == 2
    assert f"bag {bag} is corrupt or truncated" in err
    assert list(run.parent.iterdir()) == []


def test_bag_without_usable_topics_exits_2_and_says_why(
    drive_bag: Path, engine_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(drive_bag), "--topics", "/odom", *engine_args]) == 2
    captured = capsys.readouterr()
    assert "skipped /points (sensor_msgs/msg/PointCloud2): not among --topics" in captured.out
    assert "nothing to replay: no usable topic" in captured.out
    assert "nothing replayed: the bag has no usable topic" in captured.err


def test_topics_the_bag_lacks_exit_2_and_are_named(
    drive_bag: Path, engine_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(drive_bag), "--topics", "/nosuch", *engine_args]) == 2
    err = capsys.readouterr().err
    assert "nothing replayed: --topics /nosuch: no such topic in the bag" in err


def test_a_start_offset_past_the_end_exits_2_and_says_so(
    drive_bag: Path, engine_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["replay", str(drive_bag), "--start-offset", "3600", *engine_args]
    assert main(args) == 2
    err = capsys.readouterr().err
    assert "nothing replayed: --start-offset 3600 s leaves no message of /points" in err


@pytest.mark.parametrize("name", REAL_BAGS)
def test_real_recordings_are_opened_and_reported(
    shared_data: Path, name: str, engine_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    bag = shared_data / "rosbag2" / name
    assert main(["replay", str(bag), *engine_args]) == 2
    out = capsys.readouterr().out
    with bags.BagReader(bag) as reader:
        topics = reader.topics()
        # The talker bags' metadata.yaml disagrees with their storage on QoS; still read.
        read = sum(1 for _ in reader.messages())
    assert topics and read == sum(t.count for t in topics) > 0
    for topic in topics:
        assert f"skipped {topic.name} ({topic.msgtype}): " in out
    assert "nothing to replay" in out
    # Forced onto an input, an unsuitable type is still refused by name.
    assert main(["replay", str(bag), "--remap", f"{topics[0].name}:=points", *engine_args]) == 2
    out = capsys.readouterr().out
    assert f"skipped {topics[0].name} ({topics[0].msgtype}): points takes" in out


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_a_bag_with_service_events_replays_its_clouds_and_lists_what_it_skipped(
    service_event_bag: Path,
    storage: str,
    engine_args: list[str],
    capsys: pytest.CaptureFixture[str],
) -> None:
    args = ["replay", str(service_event_bag), "--mode", "inprocess", *engine_args]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert (
        "skipped /planner/get_parameters/_service_event (rcl_interfaces/srv/GetParameters_Event):"
        " service event topic: its recorded definition" in out
    )
    assert "using   /points (sensor_msgs/msg/PointCloud2, 3 messages) as points" in out
    assert "frames 3 (0 dropped)" in out


def test_detection_stream_loop_offset_and_remap(
    tmp_path: Path, engine_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    bag = tmp_path / "crowd"
    sources.write_crowd(bag, "mcap", seed=1, frames=10, agents=6, vision_msgs=True)
    run = tmp_path / "run"
    args = ["replay", str(bag), "--topics", "/detections", "/ground_truth"]
    assert main([*args, "--loop", "--max-frames", "25", "--record", str(run), *engine_args]) == 0
    doc = json.loads((run / "metrics.json").read_text())
    stamps = [f["stamp_ns"] for f in doc["frames"]]
    assert len(stamps) == 25 and stamps == sorted(stamps) and len(set(stamps)) == 25
    used = {u["role"]: u["msgtype"] for u in doc["topics"]["used"]}
    assert used == {"obstacles": bags.DETECTION3D_ARRAY, "ground_truth": bags.POINTCLOUD2}
    assert set(doc["frames"][0]["latency_ms"]) == {"track", "predict", "total"}
    assert doc["summary"]["prediction"]["matched"] + doc["summary"]["prediction"]["unpredicted"] > 0
    capsys.readouterr()
    assert main(["replay", str(bag), "--start-offset", "2.0", *engine_args]) == 0
    assert "frames 5 (0 dropped)" in capsys.readouterr().out
    paced = tmp_path / "paced"
    assert main(["replay", str(bag), "--rate", "10", "--record", str(paced), *engine_args]) == 0
    summary = json.loads((paced / "metrics.json").read_text())["summary"]
    assert summary["sim_s"] == pytest.approx(3.6)
    assert summary["wall_s"] >= 0.36 and summary["realtime_factor"] <= 10.0
    renamed = tmp_path / "renamed"
    with bags.BagReader(bag) as reader, bags.BagWriter(renamed) as writer:
        for message in reader.messages(["/obstacles"]):
            writer.add_topic("/tracker/input", message.msgtype)
            writer.write_raw("/tracker/input", message.log_ns, message.raw)
    assert main(["replay", str(renamed), "--remap", "/tracker/input:=obstacles", *engine_args]) == 0
    out = capsys.readouterr().out
    assert "using   /tracker/input (sensor_msgs/msg/PointCloud2, 10 messages) as obstacles" in out
    assert "frames 10 (0 dropped)" in out


def test_real_kitti_and_eth_bags_replay(
    tmp_path: Path, kitti_bin: Path, eth_file: Path, engine_args: list[str]
) -> None:
    sources.write_kitti(tmp_path / "kitti", "sqlite3", kitti_bin, frames=2)
    sources.write_eth_ucy(tmp_path / "eth", "mcap", eth_file, frames=20)
    for name in ("kitti", "eth"):
        run = tmp_path / f"run_{name}"
        assert main(["replay", str(tmp_path / name), "--record", str(run), *engine_args]) == 0
        doc = json.loads((run / "metrics.json").read_text())
        assert doc["summary"]["processed"] == doc["summary"]["frames"] > 0
    kitti = json.loads((tmp_path / "run_kitti" / "metrics.json").read_text())
    # The whole real scan, segmented or counted by the crop (the bag mounts the lidar
    # 1.73 m above base_link: returns above the ROI's 3 m are left out).
    counts = kitti["frames"][0]["counts"]
    assert counts["points"] + sum(counts[key] for key in scan.COUNTERS) == 17_238
    assert counts["points_no_return_removed"] == 0 and counts["points"] > 16_000
    eth = json.loads((tmp_path / "run_eth" / "metrics.json").read_text())
    assert eth["summary"]["prediction"]["matched"] > 0


@pytest.mark.parametrize("mode", ["inprocess", "dds"])
@pytest.mark.parametrize("offset", ["nan", "inf", "-inf", "-1"])
def test_bad_start_offset_exits_2(
    drive_bag: Path, mode: str, offset: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(drive_bag), "--mode", mode, f"--start-offset={offset}"]) == 2
    err = capsys.readouterr().err
    assert "--start-offset must be finite and >= 0" in err and "Traceback" not in err


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -1.0])
def test_replay_options_refuse_non_finite_offsets(value: float) -> None:
    from dynshape_perception.errors import ConfigError
    from dynshape_perception.tools.replay.inprocess import ReplayOptions

    with pytest.raises(ConfigError, match="start offset must be finite"):
        ReplayOptions(start_offset_s=value)


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_zeroed_metadata_counts_and_offsets_past_the_end(
    tmp_path: Path, storage: str, engine_args: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    bag = tmp_path / "crowd"
    sources.write_crowd(bag, storage, seed=1, frames=6, agents=3)
    meta = bag / "metadata.yaml"
    meta.write_text(meta.read_text().replace("  - message_count: 6\n", "  - message_count: 0\n"))
    assert "  - message_count: 6\n" not in meta.read_text()
    assert main(["replay", str(bag), *engine_args]) == 0
    out = capsys.readouterr().out
    assert "(sensor_msgs/msg/PointCloud2, 6 messages) as obstacles" in out
    assert "frames 6 (0 dropped)" in out
    for offset in ("2.1", "1e300"):
        assert main(["replay", str(bag), "--start-offset", offset, *engine_args]) == 2
        captured = capsys.readouterr()
        assert "frames 0 (0 dropped)" in captured.out
        assert f"--start-offset {float(offset):g} s leaves no message of" in captured.err


@pytest.mark.parametrize("storage", ["mcap", "sqlite3"])
def test_dds_offset_past_the_end_publishes_nothing(
    tmp_path: Path,
    storage: str,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from dynshape_perception.testing.processes import domain_lease

    bag = tmp_path / "crowd"
    sources.write_crowd(bag, storage, seed=1, frames=6, agents=3)
    with domain_lease() as domain:
        monkeypatch.setenv("ROS_DOMAIN_ID", str(domain))
        # Six frames 0.4 s apart: an offset of 1 s leaves the last three of both topics.
        assert main(["replay", str(bag), "--mode", "dds", "--start-offset", "1.0"]) == 0
        assert "published 6 messages" in capsys.readouterr().out
        for offset in ("2.1", "1e300"):
            # Nothing published: the replay failed to replay anything, and says so.
            assert main(["replay", str(bag), "--mode", "dds", "--start-offset", offset]) == 2
            captured = capsys.readouterr()
            assert "published 0 messages" in captured.out
            assert "nothing replayed" in captured.err
