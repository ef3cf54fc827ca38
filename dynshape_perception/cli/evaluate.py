"""``dynshape-perception evaluate``: prediction, segmentation, tracking and detection scores."""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from dynshape_perception.errors import ConfigError, DataError

PREDICTION = "prediction"
SEGMENTATION = "segmentation"
TRACKING = "tracking"
DETECTION = "detection"
DEFAULT_TRAFFIC_SCENES = 3
DEFAULT_TRAFFIC_FRAMES = 100
TARGET_PROFILE = "x86_64"
FITTED_FLAG = "fitted_on_evaluated_scene"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    tasks = parser.add_subparsers(dest="task", required=True, metavar="TASK")
    pred = tasks.add_parser(PREDICTION, help="minADE/minFDE of the predictor on an ETH/UCY scene")
    pred.add_argument(
        "--eth-ucy",
        type=Path,
        nargs="+",
        required=True,
        help="ETH/UCY 'frame id x y' file (two or more with --leave-one-out)",
    )
    pred.add_argument(
        "--leave-one-out",
        action="store_true",
        help="for each scene, fit on the other scenes plus generated data, then score it",
    )
    pred.add_argument(
        "--families",
        default=None,
        help="with --leave-one-out: the generated crowd families also left out in turn "
        "(comma-separated, or 'none'; default: sparse, dense, groups and crossing); every "
        "fit takes the others",
    )
    pred.add_argument(
        "--fit-steps",
        type=int,
        default=None,
        help="optimiser steps of each leave-one-out fit (default: the committed fit's)",
    )
    seg = tasks.add_parser(SEGMENTATION, help="the segmenter and clustering on a KITTI scan")
    seg.add_argument("--kitti-bin", type=Path, required=True, help="KITTI Velodyne .bin scan")
    seg.add_argument("--plot", type=Path, default=None, help="write a bird's-eye-view PNG")
    traffic = [
        tasks.add_parser(
            task,
            help=f"{what} of the pipeline on generated traffic with ground truth, in process",
        )
        for task, what in (
            (TRACKING, "HOTA, MOTA and IDF1 (TrackEval) by class and range"),
            (DETECTION, "box recall and BEV IoU by class and range"),
        )
    ]
    for sub in traffic:
        sub.add_argument(
            "--scenes",
            type=int,
            default=DEFAULT_TRAFFIC_SCENES,
            help="generated scenes, seeds --seed, --seed + 1, ...",
        )
        sub.add_argument(
            "--frames", type=int, default=DEFAULT_TRAFFIC_FRAMES, help="scans per scene (10 Hz)"
        )
        sub.add_argument("--cache-dir", type=Path, default=None, help="artefact cache folder")
    for sub in (pred, seg, *traffic):
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
    if args.task in (TRACKING, DETECTION):
        return _traffic(args)
    if args.task == PREDICTION and args.leave_one_out:
        return _leave_one_out(args)
    if args.task == PREDICTION:
        if len(args.eth_ucy) != 1 or args.fit_steps is not None or args.families is not None:
            raise ConfigError(
                "evaluate prediction scores one --eth-ucy file; several files, "
                "--fit-steps and --families go with --leave-one-out"
            )
        result = evaluate_prediction_file(args.eth_ucy[0], args.weights_dir, args.seed)
    else:
        result = evaluate_segmentation_file(args.kitti_bin, args.weights_dir, args.seed, args.plot)
    if args.json:
        print(json.dumps(_json_safe(result), indent=2))
    elif args.task == PREDICTION:
        _print_prediction(result)
    else:
        _print_text(result)
    return 0


def _leave_one_out(args: argparse.Namespace) -> int:
    # First: importing the fit package pins torch's kernels, and TVM imports torch when it loads.
    import dynshape_perception.tools.fit  # noqa: F401
    from dynshape_perception.tools.eval.leave_one_out import (
        check_scenes,
        leave_one_out,
        summary_lines,
    )

    if args.weights_dir is not None:
        raise ConfigError("--leave-one-out fits its own weights; it takes no --weights-dir")
    if args.fit_steps is not None and args.fit_steps < 1:
        raise ConfigError(f"--fit-steps must be >= 1, got {args.fit_steps}")
    from dynshape_perception.tools.sim.crowds import FAMILIES

    families = _families(args.families, tuple(FAMILIES))
    scenes = check_scenes(args.eth_ucy)
    fit_config = _loo_fit_config(args.fit_steps)

    def fit(
        others: Mapping[str, Path], kept: tuple[str, ...]
    ) -> tuple[dict[str, np.ndarray], dict[str, float]]:
        from dynshape_perception.models import model_definition
        from dynshape_perception.tools.fit.data import SYNTHETIC
        from dynshape_perception.tools.fit.predictor import fit_predictor

        sources = (*sorted(others), *kept, SYNTHETIC)
        weights, _, stats = fit_predictor(
            model_definition("predictor"), sources, args.seed, fit_config, scene_files=others
        )
        return weights, stats

    def score(weights: Mapping[str, np.ndarray], part: Any) -> dict[str, Any]:
        from dynshape_perception.io.datasets import read_eth_ucy
        from dynshape_perception.models import model_definition
        from dynshape_perception.tools.eval.leave_one_out import family_eval_tracks

        loaded = _compiled(model_definition("predictor"), weights)
        if part.path is None:
            return _score_tracks(family_eval_tracks(part.name, args.seed), loaded, args.seed)
        return _score_prediction(read_eth_ucy(part.path), loaded, args.seed)

    def progress(line: str) -> None:
        print(f"left out {line}", file=sys.stderr, flush=True)

    rows = leave_one_out(scenes, families, tuple(FAMILIES), fit, score, progress)
    report = {"leave_one_out": {"seed": args.seed, "fit_steps": fit_config.steps, "scenes": rows}}
    if args.json:
        print(json.dumps(_json_safe(report), indent=2))
    else:
        print("\n".join(summary_lines(rows)))
    return 0


def _traffic(args: argparse.Namespace) -> int:
    """Generated scenes through the in-process replay; the tracking or detection table."""
    from dynshape_perception.cli.replay import build_engine
    from dynshape_perception.tools.eval.tracking import (
        DETECTION_COLUMNS,
        TRACKING_COLUMNS,
        table_lines,
    )
    from dynshape_perception.tools.eval.traffic_run import evaluate_traffic
    from dynshape_perception.tools.replay.settings import settings_from_values
    from dynshape_perception.tools.sim.traffic import TrafficConfig

    if args.scenes < 1 or args.frames < 1:
        raise ConfigError(f"--scenes and --frames must be >= 1, got {args.scenes}, {args.frames}")
    configs = [TrafficConfig(seed=args.seed + k, frames=args.frames) for k in range(args.scenes)]
    settings = settings_from_values({})
    with build_engine(settings, args.cache_dir, args.weights_dir) as engine:
        report = evaluate_traffic(engine, settings, configs)
    rows = report[args.task]
    if args.json:
        scenes = {k: report[k] for k in ("scenes", "frames", "dropped_frames")}
        print(json.dumps(_json_safe({**scenes, args.task: rows}), indent=2))
        return 0
    seeds = ", ".join(str(c.seed) for c in configs)
    print(
        f"{args.task}: {len(configs)} generated scene(s) (seeds {seeds}), {report['frames']} "
        f"scans, {report['dropped_frames']} dropped"
    )
    columns = TRACKING_COLUMNS if args.task == TRACKING else DETECTION_COLUMNS
    print("\n".join(table_lines(rows, columns)))
    return 0


def _families(text: str | None, known: tuple[str, ...]) -> tuple[str, ...]:
    if text is None:
        return known
    if text.strip().lower() == "none":
        return ()
    names = tuple(dict.fromkeys(part.strip().lower() for part in text.split(",") if part.strip()))
    unknown = [name for name in names if name not in known]
    if not names or unknown:
        raise ConfigError(
            f"--families takes 'none' or a comma-separated list of {', '.join(known)}; got {text!r}"
        )
    return names


def _loo_fit_config(steps: int | None) -> Any:
    from dataclasses import replace

    from dynshape_perception.tools.fit.runner import PLANS

    committed = PLANS["predictor"].hyperparameters
    if steps is None:
        return committed
    return replace(
        committed, steps=steps, calibration_steps=min(steps, committed.calibration_steps)
    )


def _compiled(model: Any, weights: Mapping[str, np.ndarray]) -> Any:
    from dynshape_perception.compiler.cache import ArtefactCache
    from dynshape_perception.compiler.targets import load_profile
    from dynshape_perception.runtime.executable import LoadedModel

    artefact = ArtefactCache().get_or_build(model, weights, load_profile(TARGET_PROFILE))
    return LoadedModel(model, artefact.library_path)


def _loaded_model(name: str, weights_dir: Path | None) -> tuple[Any, dict[str, Any]]:
    """The committed (or ``weights_dir``) model, compiled through the cache, and its entry."""
    from dynshape_perception.models.registry import committed_weights
    from dynshape_perception.models.weights import read_manifest

    model, weights = committed_weights(name, weights_dir)
    entry = read_manifest(weights_dir)["models"][name]
    return _compiled(model, weights), entry


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

    scene = read_eth_ucy(path).require_rows()
    loaded, entry = _loaded_model("predictor", weights_dir)
    result = _score_prediction(scene, loaded, seed)
    seen = fitted_on(entry, path)
    if seen is not None:
        _warn_fitted("predictor", seen, path)
        result[FITTED_FLAG] = True
    return result


def _score_prediction(scene: Any, loaded: Any, seed: int) -> dict[str, Any]:
    """``evaluate_prediction`` of a read ETH/UCY scene, the predictor run through TVM."""
    path = scene.path
    try:
        result = _score_tracks(scene.tracks(), loaded, seed)
    except DataError as err:
        raise DataError(f"ETH/UCY file {path}: {err}") from err
    if scene.skipped_rows:
        print(f"note: {path.name}: skipped {scene.skipped_rows} malformed row(s)", file=sys.stderr)
    return result


def _score_tracks(tracks: Any, loaded: Any, seed: int) -> dict[str, Any]:
    """``evaluate_prediction`` of tracks, the predictor run through TVM."""
    from dynshape_perception.tools.eval.prediction import evaluate_prediction

    batch = int(loaded.model.spec.bounds["A"])

    def predict(obs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        # The model sees positions relative to the last observation: float32 keeps
        # centimetres there whatever the scene's world origin.
        last = obs[:, -1:, :]
        history = np.ascontiguousarray(obs - last, dtype=np.float32)
        lengths = np.full(obs.shape[0], obs.shape[1], dtype=np.int32)
        traj, probs = loaded("forward", history, lengths)
        return traj.astype(np.float64) + last[:, None], probs.astype(np.float64)

    return evaluate_prediction(tracks, predict, seed=seed, batch_size=batch)


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


def _print_prediction(result: dict[str, Any]) -> None:
    from dynshape_perception.tools.eval.leave_one_out import scene_lines

    print("\n".join(scene_lines(result)))


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
