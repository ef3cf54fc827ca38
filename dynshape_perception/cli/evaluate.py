"""``dynshape-perception evaluate``: the predictor on ETH/UCY, the segmenter on KITTI, via TVM."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from pathlib import Path
from typing import Any

import numpy as np

from dynshape_perception.errors import DataError

PREDICTION = "prediction"
SEGMENTATION = "segmentation"
TARGET_PROFILE = "x86_64"
FITTED_FLAG = "fitted_on_evaluated_scene"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    tasks = parser.add_subparsers(dest="task", required=True, metavar="TASK")
    pred = tasks.add_parser(PREDICTION, help="minADE/minFDE of the predictor on an ETH/UCY scene")
    pred.add_argument("--eth-ucy", type=Path, required=True, help="ETH/UCY 'frame id x y' file")
    seg = tasks.add_parser(SEGMENTATION, help="the segmenter and clustering on a KITTI scan")
    seg.add_argument("--kitti-bin", type=Path, required=True, help="KITTI Velodyne .bin scan")
    seg.add_argument("--plot", type=Path, default=None, help="write a bird's-eye-view PNG")
    for sub in (pred, seg):
        sub.add_argument("--json", action="store_true", help="print the result as JSON")
        sub.add_argument(
            "--weights-dir",
            type=Path,
            default=None,
            help="folder with <model>.npz and manifest.yaml (default: the package's models/)",
        )
        sub.add_argument("--seed", type=int, default=0, help="seed of RANSAC and the bootstrap")


def run(args: argparse.Namespace) -> int:
    from dynshape_perception.config import check_seed

    check_seed("--seed", args.seed)
    if args.task == SEGMENTATION and args.plot is not None:
        from dynshape_perception.tools.eval.segmentation import check_plot_path

        check_plot_path(args.plot)
    if args.task == PREDICTION:
        result = evaluate_prediction_file(args.eth_ucy, args.weights_dir, args.seed)
    else:
        result = evaluate_segmentation_file(args.kitti_bin, args.weights_dir, args.seed, args.plot)
    if args.json:
        print(json.dumps(_json_safe(result), indent=2))
    else:
        _print_text(result)
    return 0


def _loaded_model(name: str, weights_dir: Path | None) -> tuple[Any, dict[str, Any]]:
    """The committed (or ``weights_dir``) model, compiled through the cache, and its entry."""
    from dynshape_perception.compiler.cache import ArtefactCache
    from dynshape_perception.compiler.targets import load_profile
    from dynshape_perception.models.registry import committed_weights
    from dynshape_perception.models.weights import read_manifest
    from dynshape_perception.runtime.executable import LoadedModel

    model, weights = committed_weights(name, weights_dir)
    entry = read_manifest(weights_dir)["models"][name]
    artefact = ArtefactCache().get_or_build(model, weights, load_profile(TARGET_PROFILE))
    return LoadedModel(model, artefact.library_path), entry


def fitted_on(entry: dict[str, Any], path: Path) -> str | None:
    """The name of the training source that is this very file, if the weights saw it."""
    try:
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as err:
        raise DataError(f"cannot read {path}: {err}") from err
    for source in entry.get("data", []):
        if source.get("sha256") == digest:
            return str(source.get("name", path.name))
    return None


def _warn_fitted(model: str, scene: str, path: Path) -> None:
    print(
        f"warning: the {model} weights were fitted on {path.name} (data source {scene!r}); "
        "these figures are not a held-out result",
        file=sys.stderr,
    )


def evaluate_prediction_file(path: Path, weights_dir: Path | None, seed: int = 0) -> dict[str, Any]:
    """The prediction report for one scene, the predictor run through TVM."""
    from dynshape_perception.io.datasets import read_eth_ucy
    from dynshape_perception.tools.eval.prediction import evaluate_prediction

    scene = read_eth_ucy(path).require_rows()
    loaded, entry = _loaded_model("predictor", weights_dir)
    batch = int(loaded.model.spec.bounds["A"])

    def predict(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # The model sees positions relative to the last observation: float32 keeps
        # centimetres there whatever the scene's world origin.
        last = obs[:, -1:, :]
        history = np.ascontiguousarray(obs - last, dtype=np.float32)
        lengths = np.full(obs.shape[0], obs.shape[1], dtype=np.int32)
        traj, probs = loaded("forward", history, lengths)
        return traj.astype(np.float64) + last[:, None], probs.astype(np.float64)

    try:
        result = evaluate_prediction(scene.tracks(), predict, seed=seed, batch_size=batch)
    except DataError as err:
        raise DataError(f"ETH/UCY file {path}: {err}") from err
    if scene.skipped_rows:
        print(f"note: {path.name}: skipped {scene.skipped_rows} malformed row(s)", file=sys.stderr)
    seen = fitted_on(entry, path)
    if seen is not None:
        _warn_fitted("predictor", seen, path)
        result[FITTED_FLAG] = True
    return result


def evaluate_segmentation_file(
    path: Path, weights_dir: Path | None, seed: int = 0, plot: Path | None = None
) -> dict[str, Any]:
    """Segmenter (TVM) on a KITTI scan with its RANSAC ground, clustering, and the metrics."""
    from dynshape_perception.config import default_config
    from dynshape_perception.io.datasets import read_kitti_bin
    from dynshape_perception.perception.clustering import ClusterParams, cluster_obstacles
    from dynshape_perception.perception.ground import fit_ground_plane
    from dynshape_perception.tools.eval.segmentation import evaluate_segmentation, plot_bev

    points = read_kitti_bin(path, allow_empty=False)
    ground = fit_ground_plane(points, seed=seed)
    loaded, entry = _loaded_model("segmenter", weights_dir)
    (scores,) = loaded("forward", points, ground.as_array())
    params = ClusterParams()
    clusters = cluster_obstacles(points, scores, params, ground)
    result = evaluate_segmentation(
        points, scores, params.score_threshold, clusters, seed=seed, roi=params.roi
    )
    if plot is not None:
        plot_bev(
            plot,
            points,
            scores,
            clusters,
            default_config().roi,
            params.score_threshold,
            title=f"{path.name}: {points.shape[0]} points, {len(clusters)} clusters",
        )
    seen = fitted_on(entry, path)
    if seen is not None:
        _warn_fitted("segmenter", seen, path)
        result[FITTED_FLAG] = True
    return result


def _json_safe(value: Any) -> Any:
    """NaN (a share over no points) becomes null: JSON has no NaN."""
    if isinstance(value, float) and math.isnan(value):
        return None
    if isinstance(value, dict):
        return {key: _json_safe(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_json_safe(item) for item in value]
    return value


def _print_text(result: dict[str, Any]) -> None:
    for key, value in result.items():
        if key == "clusters":
            print(f"clusters: {len(value)}")
            for index, row in enumerate(value):
                print(
                    f"  {index:3d} x {row['x']:7.2f} y {row['y']:7.2f} z {row['z']:6.2f}  "
                    f"{row['length']:5.2f} x {row['width']:5.2f} x {row['height']:5.2f} m  "
                    f"yaw {row['yaw']:6.2f}  {row['num_points']} points"
                )
        else:
            print(f"{key}: {value}")
