"""``bench e2e``: latency from publishing the KITTI scan to receiving its predictions, over DDS."""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path
from typing import Any

import numpy as np

from dynshape_perception.errors import ConfigError
from dynshape_perception.io.datasets import read_kitti_bin
from dynshape_perception.resources import shared_data_dir
from dynshape_perception.tools.bench.prediction_cost import LENGTHS

MODES = ("separate", "composed")
# The standard outputs of testing.session (imported there with rclpy, only when measuring).
DETECTED, TRACKED, PREDICTED = "detected_objects", "tracked_objects", "predicted_objects"
KITTI_SCAN = Path("lidar") / "kitti_000008.bin"
FIRST_STAMP_NS = 1_000_000_000
PERCENTILE = 99.0
# Long enough for one /diagnostics report at the default period.
STATUS_WAIT_S = 1.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--mode", choices=(*MODES, "both", "none"), default="both", help="none: no DDS run"
    )
    parser.add_argument(
        "--prediction-cost",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="per-frame prediction cost at history lengths 8, 32, 128 (prediction stage)",
    )
    parser.add_argument(
        "--cost-lengths", type=int, nargs="+", default=list(LENGTHS), help="history lengths"
    )
    parser.add_argument("--cost-agents", type=int, default=32, help="agents of every frame")
    parser.add_argument("--cost-repeats", type=int, default=10, help="scenes per length")
    parser.add_argument("--frames", type=int, default=50, help="measured frames per mode")
    parser.add_argument("--warmup", type=int, default=5, help="frames sent before measuring")
    parser.add_argument("--scan", type=Path, default=None, help="KITTI .bin scan to publish")
    parser.add_argument("--params-file", type=Path, default=None, help="node parameters YAML")
    parser.add_argument("--weights-dir", default="", help="weights folder (default: committed)")
    parser.add_argument("--cache-dir", default="", help="artefact cache folder of the nodes")
    parser.add_argument("--jit", choices=("off", "frozen", "adaptive"), default=None)
    parser.add_argument("--frame-timeout-s", type=float, default=10.0)
    parser.add_argument("--startup-timeout-s", type=float, default=180.0)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")


def _scan(path: Path | None) -> np.ndarray:
    if path is None:
        data = shared_data_dir()
        if data is None:
            raise ConfigError("no --scan given and ../shared/data is absent")
        path = data / KITTI_SCAN
    return read_kitti_bin(path, allow_empty=False)


def summary(latencies_ms: list[float]) -> dict[str, float]:
    values = np.asarray(latencies_ms, dtype=np.float64)
    if values.size == 0:
        return {"median_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    return {
        "median_ms": round(float(np.median(values)), 3),
        "p99_ms": round(float(np.percentile(values, PERCENTILE)), 3),
        "mean_ms": round(float(values.mean()), 3),
        "max_ms": round(float(values.max()), 3),
    }


def measure(mode: str, points: np.ndarray, args: argparse.Namespace) -> dict[str, Any]:
    """One closed-loop run: each scan is sent once the previous one's predictions are back."""
    from dynshape_perception.perception.pipeline import Pose2D
    from dynshape_perception.testing.session import OUTPUTS, STAMP_STEP_NS, node_session

    overrides: dict[str, bool | int | float | str] = {}
    if args.weights_dir:
        overrides["weights_dir"] = str(args.weights_dir)
    if args.cache_dir:
        overrides["model_cache_dir"] = str(args.cache_dir)
    if args.jit:
        overrides["jit.mode"] = args.jit
    per_topic: dict[str, list[float]] = {t: [] for t in OUTPUTS}
    lost = 0
    with node_session(
        mode,
        params_file=args.params_file,
        overrides=overrides,
        startup_timeout_s=args.startup_timeout_s,
    ) as session:
        stamp = session.prime(points, FIRST_STAMP_NS, args.warmup, args.frame_timeout_s)
        for _ in range(args.warmup):
            session.frame(points, stamp, Pose2D(), args.frame_timeout_s)
            stamp += STAMP_STEP_NS
        for _ in range(args.frames):
            timing = session.frame(points, stamp, Pose2D(), args.frame_timeout_s)
            stamp += STAMP_STEP_NS
            for topic, ms in timing.after_publish_ms.items():
                if ms is not None:
                    per_topic[topic].append(ms)
            lost += timing.after_publish_ms[PREDICTED] is None
        session.probe.spin_for(float(STATUS_WAIT_S))
        statuses = {proc.name: session.probe.status(proc.name) for proc in session.processes}
    return {
        "mode": mode,
        "frames": args.frames,
        "lost": lost,
        "points": int(points.shape[0]),
        "scan_to_predictions": summary(per_topic[PREDICTED]),
        "scan_to": {t: summary(v) for t, v in per_topic.items()},
        "node_status": {
            name: (status.values if status is not None else {}) for name, status in statuses.items()
        },
    }


def stage_prediction_cost(args: argparse.Namespace) -> dict[str, Any]:
    """The prediction stage's per-frame cost at each history length, on the nodes' weights."""
    from dynshape_perception import parameters
    from dynshape_perception.runtime.engine import Engine
    from dynshape_perception.runtime.policy import JitConfig
    from dynshape_perception.tools.bench.prediction_cost import stage_cost

    settings = parameters.prediction_settings({})
    jit = JitConfig(mode=args.jit or "off")
    with Engine(
        "x86_64",
        jit,
        models=("predictor",),
        cache_dir=Path(args.cache_dir) if args.cache_dir else None,
        weights_dir=Path(args.weights_dir) if args.weights_dir else None,
    ) as engine:
        cost = stage_cost(
            engine["predictor"], settings, args.cost_lengths, args.cost_agents, args.cost_repeats
        )
    return {"path": "prediction stage, in process", "jit": jit.mode, **cost}


def run(args: argparse.Namespace) -> int:
    if args.params_file is not None:
        from dynshape_perception.tools.replay.params import load_params_file

        # The nodes would each fail to start on it, with rcl's traceback.
        load_params_file(args.params_file)
    modes = {"both": MODES, "none": ()}.get(args.mode, (args.mode,))
    points = _scan(args.scan) if modes else None
    measured = {mode: measure(mode, points, args) for mode in modes if points is not None}
    results: dict[str, Any] = {
        "benchmark": "e2e",
        "machine": {"cpu_count": _cpu_count(), "platform": platform.platform()},
        "transport": "Fast DDS LARGE_DATA, ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST",
        "modes": measured,
    }
    if args.prediction_cost:
        cost = stage_prediction_cost(args)
        results["prediction_cost"] = cost
        print(f"prediction cost per frame, {cost['agents']} agents ({cost['path']}):")
        for mode in ("incremental", "full"):
            row = "  ".join(
                f"T={length}: {v['p50_ms']:.3f} ms" for length, v in cost[mode].items()
            )
            print(f"  {mode:<12} {row}")
    print(
        f"{'mode':<10}{'points':>8}{'frames':>8}{'lost':>6}{'median_ms':>11}{'p99_ms':>9}"
        f"{'obstacles_ms':>14}{'tracks_ms':>11}"
    )
    for mode, r in measured.items():
        e2e, to = r["scan_to_predictions"], r["scan_to"]
        print(
            f"{mode:<10}{r['points']:>8}{r['frames']:>8}{r['lost']:>6}{e2e['median_ms']:>11.1f}"
            f"{e2e['p99_ms']:>9.1f}{to[DETECTED]['median_ms']:>14.1f}"
            f"{to[TRACKED]['median_ms']:>11.1f}"
        )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if all(r["lost"] == 0 for r in measured.values()) else 1


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0))
