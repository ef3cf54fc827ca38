"""``dynshape-perception evaluate``: known answers with hand-set weights, then the real files."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from dynshape_perception.cli.evaluate import FITTED_FLAG, fitted_on
from dynshape_perception.cli.main import main
from dynshape_perception.compiler import cache
from dynshape_perception.models import model_definition
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import read_manifest, save_weights

SEGMENTATION_KEYS = {"ground_excluded", "raised_detected", "clusters", "num_points", "roi_points"}
CLUSTER_KEYS = {"x", "y", "z", "length", "width", "height", "yaw", "num_points"}
FRAME_STEP = 10
SENSOR_HEIGHT_M = 1.73
# A score of 1000 * relu(height - 0.25 m) - 5 through the segmenter's MLP (scores in sigmoid).
SEGMENT_ABOVE_M = 0.25
SEGMENT_GAIN = 3000.0
SEGMENT_OFFSET = -5.0

# Figures of the committed weights (models/manifest.yaml), fitted on ETH among the rest, from
# `dynshape-perception evaluate prediction --eth-ucy ../shared/data/eth_ucy/biwi_eth.txt --json`
# and `dynshape-perception evaluate segmentation --kitti-bin .../kitti_000008.bin --json`.
COMMITTED_ETH = {
    "minADE": 0.4679,
    "minFDE": 0.8402,
    "top1_ADE": 0.9982,
    "top1_FDE": 2.1105,
    "cv_ADE": 1.0776,
    "cv_FDE": 2.2883,
    "cv6_minADE": 0.6309,
    "cv6_minFDE": 1.102,
    "windows": 362,
}
COMMITTED_KITTI_CLUSTERS = 39
# TVM's float32 kernels may round differently on another CPU.
FIGURE_TOLERANCE_M = 2e-3


@pytest.fixture(autouse=True)
def _private_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DYNSHAPE_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "tvm-cache"))
    assert cache.default_cache_dir().name == "tvm-cache"


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[dict[str, Any], str]:
    assert main(list(argv)) == 0
    captured = capsys.readouterr()
    return json.loads(captured.out), captured.err


def _evaluate(
    capsys: pytest.CaptureFixture[str],
    task: str,
    data: Path,
    weights: Path | None = None,
    *extra: str,
) -> tuple[dict[str, Any], str]:
    """``evaluate <task> --json`` on one file, with the weights in ``weights`` (None: the
    committed ones): the JSON report and stderr."""
    flag = "--eth-ucy" if task == "prediction" else "--kitti-bin"
    weight_args = () if weights is None else ("--weights-dir", str(weights))
    return _run(capsys, "evaluate", task, flag, str(data), "--json", *weight_args, *extra)


def _straight_scene(path: Path) -> Path:
    """Two pedestrians on straight lines at constant speed, 25 annotated frames each."""
    frames = np.arange(0, 25 * FRAME_STEP, FRAME_STEP)
    rows = []
    for ped, (start, velocity) in enumerate((((1.0, 2.0), (0.5, 0.1)), ((-3.0, 4.0), (0.0, -0.4)))):
        for i, frame in enumerate(frames):
            x, y = np.asarray(start) + i * np.asarray(velocity)
            rows.append(f"{frame}\t{ped + 1}\t{x:.4f}\t{y:.4f}")
    rows.insert(5, "not a row")
    path.write_text("\n".join(rows) + "\n")
    return path


def _zero_predictor(directory: Path, fitted_file: Path | None = None) -> Path:
    """All-zero weights: no residual and equal logits, so every hypothesis is constant velocity."""
    shapes = parameter_shapes(model_definition("predictor"))
    weights = {key: np.zeros(shape, np.float32) for key, shape in shapes.items()}
    data = []
    if fitted_file is not None:
        digest = hashlib.sha256(fitted_file.read_bytes()).hexdigest()
        data.append({"name": "straight", "file": fitted_file.name, "sha256": digest})
    save_weights("predictor", weights, {"model": "predictor", "data": data}, directory)
    return directory


def test_prediction_zero_weights_are_exact_on_straight_lines(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    prediction_keys: frozenset[str],
    prediction_metrics: frozenset[str],
) -> None:
    scene = _straight_scene(tmp_path / "straight.txt")
    weights = _zero_predictor(tmp_path / "models")
    result, err = _evaluate(capsys, "prediction", scene, weights)
    assert set(result) == prediction_keys
    assert result["windows"] == 2 * (25 - 20 + 1)
    for key in prediction_metrics:
        assert result[key] == pytest.approx(0.0, abs=1e-4), key
    assert "skipped 1 malformed row" in err
    assert "warning" not in err


def test_prediction_flags_a_scene_the_weights_saw(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], prediction_keys: frozenset[str]
) -> None:
    scene = _straight_scene(tmp_path / "straight.txt")
    weights = _zero_predictor(tmp_path / "models", fitted_file=scene)
    result, err = _evaluate(capsys, "prediction", scene, weights)
    assert result[FITTED_FLAG] is True
    assert set(result) == prediction_keys | {FITTED_FLAG}
    assert "warning: the predictor weights were fitted on straight.txt" in err
    entry = read_manifest(weights)["models"]["predictor"]
    assert fitted_on(entry, scene) == "straight"
    # The scene is known by its bytes, whatever the file is called.
    assert fitted_on(entry, _straight_scene(tmp_path / "renamed.txt")) == "straight"
    (tmp_path / "other.txt").write_text("0\t1\t0\t0\n")
    assert fitted_on(entry, tmp_path / "other.txt") is None


def _threshold_segmenter(directory: Path) -> Path:
    """Hand-set weights scoring points by height above the ground input alone."""
    shapes = parameter_shapes(model_definition("segmenter"))
    weights = {key: np.zeros(shape, np.float32) for key, shape in shapes.items()}
    weights["l1.weight"][0, 0] = 1.0  # feature 0 is height / 3
    weights["l2.weight"][0, 0] = 1.0
    weights["l2.bias"][0] = -SEGMENT_ABOVE_M / 3.0
    weights["score.weight"][0, 0] = SEGMENT_GAIN
    weights["score.bias"][0] = SEGMENT_OFFSET
    save_weights("segmenter", weights, {"model": "segmenter", "data": []}, directory)
    return directory


def _flat_scan(path: Path) -> tuple[Path, list[tuple[float, float]]]:
    """Flat ground 1.73 m below the sensor and two 4 x 2 m boxes on it, as a KITTI .bin."""
    rng = np.random.default_rng(0)
    ground = np.c_[rng.uniform(2, 50, 6000), rng.uniform(-20, 20, 6000), np.zeros(6000)]
    centres = [(12.0, 4.0), (25.0, -6.0)]
    boxes = [
        np.c_[
            rng.uniform(x - 2, x + 2, 600),
            rng.uniform(y - 1, y + 1, 600),
            rng.uniform(0.4, 1.5, 600),
        ]
        for x, y in centres
    ]
    xyz = np.concatenate([ground, *boxes])
    xyz[:, 2] -= SENSOR_HEIGHT_M
    points = np.c_[xyz, rng.random(xyz.shape[0])].astype("<f4")
    path.write_bytes(points.tobytes())
    return path, centres


def test_segmentation_threshold_weights_on_flat_ground(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scan, centres = _flat_scan(tmp_path / "flat.bin")
    weights = _threshold_segmenter(tmp_path / "models")
    png = tmp_path / "bev.png"
    result, err = _evaluate(capsys, "segmentation", scan, weights, "--plot", str(png))
    assert set(result) == SEGMENTATION_KEYS
    assert result["ground_excluded"] == 1.0
    assert result["raised_detected"] == 1.0
    assert len(result["clusters"]) == len(centres)
    by_x = sorted(result["clusters"], key=lambda cluster: cluster["x"])
    for cluster, (x, y) in zip(by_x, centres, strict=True):
        assert set(cluster) == CLUSTER_KEYS
        assert cluster["x"] == pytest.approx(x, abs=0.2)
        assert cluster["y"] == pytest.approx(y, abs=0.2)
        assert cluster["length"] == pytest.approx(4.0, abs=0.3)
        assert cluster["width"] == pytest.approx(2.0, abs=0.3)
        assert cluster["num_points"] == 600
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert err == ""


def test_segmentation_json_has_no_nan(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    scan = tmp_path / "ground_only.bin"
    rng = np.random.default_rng(1)
    flat = np.c_[rng.uniform(2, 50, (500, 2)), np.full(500, -SENSOR_HEIGHT_M), np.zeros(500)]
    scan.write_bytes(flat.astype("<f4").tobytes())
    weights = _threshold_segmenter(tmp_path / "models")
    result, _ = _evaluate(capsys, "segmentation", scan, weights)
    assert result["raised_detected"] is None  # a share over no raised points
    assert result["clusters"] == []


def test_missing_file_is_an_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    weights = _zero_predictor(tmp_path / "models")
    code = main(
        [
            "evaluate",
            "prediction",
            "--eth-ucy",
            str(tmp_path / "absent.txt"),
            "--weights-dir",
            str(weights),
        ]
    )
    assert code == 2
    assert "cannot read" in capsys.readouterr().err


def test_committed_predictor_on_eth(
    eth_file: Path, capsys: pytest.CaptureFixture[str], prediction_keys: frozenset[str]
) -> None:
    result, err = _evaluate(capsys, "prediction", eth_file)
    # Fitted on every real scene: held-out figures are leave-one-out's.
    assert set(result) == prediction_keys | {FITTED_FLAG} and result[FITTED_FLAG] is True
    assert "were fitted on biwi_eth.txt" in err
    for key, value in COMMITTED_ETH.items():
        assert result[key] == pytest.approx(value, abs=FIGURE_TOLERANCE_M), key
    assert result["minADE"] <= 0.9 * result["cv6_minADE"]
    assert result["minFDE"] <= 0.9 * result["cv6_minFDE"]
    assert result["top1_ADE"] <= 1.1 * result["cv_ADE"]
    lo, hi = result["ci95"]["minADE"]
    assert lo <= result["minADE"] <= hi


def test_committed_predictor_flags_hotel(
    hotel_file: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    result, err = _evaluate(capsys, "prediction", hotel_file)
    assert result[FITTED_FLAG] is True
    assert "were fitted on biwi_hotel.txt" in err


def test_committed_segmenter_on_kitti(
    kitti_bin: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    png = tmp_path / "kitti.png"
    result, _ = _evaluate(capsys, "segmentation", kitti_bin, None, "--plot", str(png))
    assert result["ground_excluded"] >= 0.95
    assert result["raised_detected"] >= 0.90
    assert len(result["clusters"]) == COMMITTED_KITTI_CLUSTERS
    assert png.stat().st_size > 50_000


def _crowd_file(path: Path, seed: int, speed_mps: float) -> Path:
    """A generated crowd written as an ETH/UCY file: 12 agents, 30 annotated frames."""
    from dynshape_perception.tools.sim.scenes import Crowd, crowd_scene

    tracks = crowd_scene(seed, 12, 30, crowd=Crowd(area_m=12.0, speed_mps=speed_mps))
    rows = [
        f"{FRAME_STEP * step}\t{agent + 1}\t{x:.3f}\t{y:.3f}"
        for agent in range(tracks.shape[0])
        for step, (x, y) in enumerate(tracks[agent])
    ]
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize(
    ("case", "needle"),
    [
        ("one", "two or more --eth-ucy scenes"),
        ("missing", "absent.txt"),
        ("twins", "holds the same bytes as"),
        ("no_window", "short.txt: no window of 20"),
        ("weights", "takes no --weights-dir"),
        ("steps", "--fit-steps must be >= 1"),
        ("families", "--families takes 'none' or a comma-separated list of sparse"),
    ],
)
def test_leave_one_out_refuses_bad_input_before_any_fit(
    case: str, needle: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = str(_straight_scene(tmp_path / "straight.txt"))
    other = str(_crowd_file(tmp_path / "crowd.txt", seed=1, speed_mps=1.0))
    (tmp_path / "short.txt").write_text("0\t1\t0.0\t0.0\n10\t1\t0.4\t0.0\n")
    (tmp_path / "twin.txt").write_text((tmp_path / "straight.txt").read_text())
    files = {
        "one": [good],
        "missing": [good, str(tmp_path / "absent.txt")],
        "twins": [good, str(tmp_path / "twin.txt")],
        "no_window": [good, str(tmp_path / "short.txt")],
        "weights": [good, other],
        "steps": [good, other],
        "families": [good, other],
    }[case]
    extra = {
        "weights": ["--weights-dir", str(tmp_path)],
        "steps": ["--fit-steps", "0"],
        "families": ["--families", "sparse,parade"],
    }
    argv = ["evaluate", "prediction", "--leave-one-out", "--eth-ucy", *files]
    assert main([*argv, *extra.get(case, [])]) == 2
    err = capsys.readouterr().err
    assert needle in err and err.count("\n") == 1, err


def test_several_files_need_leave_one_out(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scene = str(_straight_scene(tmp_path / "straight.txt"))
    assert main(["evaluate", "prediction", "--eth-ucy", scene, scene]) == 2
    assert "go with --leave-one-out" in capsys.readouterr().err
    assert main(["evaluate", "prediction", "--eth-ucy", scene, "--families", "dense"]) == 2
    assert "--families go with --leave-one-out" in capsys.readouterr().err


@pytest.mark.slow
def test_leave_one_out_scores_each_scene_with_weights_fitted_without_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    slow = _crowd_file(tmp_path / "slow.txt", seed=1, speed_mps=0.7)
    fast = _crowd_file(tmp_path / "fast.txt", seed=2, speed_mps=1.4)
    argv = ["evaluate", "prediction", "--leave-one-out", "--fit-steps", "20"]
    argv += ["--families", "sparse"]
    report, _ = _run(capsys, *argv, "--eth-ucy", str(slow), str(fast), "--json")
    loo = report["leave_one_out"]
    assert loo["fit_steps"] == 20 and loo["seed"] == 0
    assert [row["scene"] for row in loo["scenes"]] == ["slow", "fast", "sparse"]
    families = ["sparse", "dense", "groups", "crossing"]
    sparse = loo["scenes"][2]
    assert sparse["kind"] == "generated" and sparse["fitted_on"] == [
        "fast",
        "slow",
        *families[1:],
        "synthetic",
    ]
    assert sparse["windows"] > 0 and "file" not in sparse
    assert sum(b["windows"] for b in sparse["breakdown"]["by_speed_mps"]) == sparse["windows"]
    assert 0.0 <= sparse["ranking"]["top_is_cv_share"] <= 1.0
    for row, other in zip(loo["scenes"][:2], ["fast", "slow"], strict=True):
        assert row["kind"] == "real"
        assert row["fitted_on"] == [other, *families, "synthetic"]
        assert row["windows"] == 12 * (30 - 20 + 1) and row["pedestrians"] == 12
        assert row["fit_stats"]["real_windows"] == 12 * (30 - 12 - 1)
        for ratio in row["ratios"].values():
            lo, hi = ratio["ci95"]
            assert lo <= ratio["value"] <= hi
        calib = row["calibration"]
        assert sum(b["windows"] for b in calib["reliability"]) == row["windows"]
        assert 1 / 6 <= calib["confidence"] <= 1 and 0 <= calib["ece"] <= 1
    # The text form is the table: a row per metric, each ratio with its interval.
    assert main([*argv, "--eth-ucy", str(slow), str(fast)]) == 0
    text = capsys.readouterr().out
    assert text.count("top-1 ADE") == 3 and text.count("minFDE@6") == 3
    assert "fitted on fast + sparse + dense" in text and "expected calibration error" in text
    assert text.count("ranking: CV ranked first in") == 3 and "people in view" in text
