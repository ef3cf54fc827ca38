"""``dynshape-perception demo``: a generated scene through the nodes over DDS (or in-process)."""

from __future__ import annotations

import argparse
import math

import numpy as np

from dynshape_perception.config import check_seed
from dynshape_perception.errors import ConfigError
from dynshape_perception.perception.pipeline import Pipeline, PipelineParams, Pose2D
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.runtime.policy import JitConfig
from dynshape_perception.stats import median
from dynshape_perception.tools.sim.scenes import driving_scene

EGO_SPEED_MPS = 5.0
FRAME_PERIOD_S = 0.1
COLUMNS = ("segment", "cluster", "track", "predict", "total")
DDS_COLUMNS = ("to_obstacles_ms", "to_tracks_ms", "to_predict_ms", "e2e_ms")
# The nodes' standard outputs (testing.session's names; it imports rclpy, so only in --dds).
DETECTED, TRACKED, PREDICTED = "detected_objects", "tracked_objects", "predicted_objects"
DDS_FIRST_STAMP_NS = 1_000_000_000
# Long enough for one /diagnostics report at the default period.
DIAGNOSTICS_WAIT_S = 1.5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--frames", type=int, default=20, help="frames to process")
    parser.add_argument("--seed", type=int, default=7, help="scene seed")
    parser.add_argument("--target", default="x86_64", help="target profile")
    parser.add_argument("--jit", choices=("off", "adaptive"), default="adaptive")
    parser.add_argument(
        "--in-process", action="store_true", help="call the pipeline directly, without ROS"
    )
    parser.add_argument(
        "--composed",
        action="store_true",
        help="DDS mode: one perception_pipeline process instead of three nodes",
    )
    parser.add_argument("--weights-dir", default="", help="DDS mode: weights folder of the nodes")
    parser.add_argument("--frame-timeout-s", type=float, default=10.0)
    parser.add_argument("--startup-timeout-s", type=float, default=180.0)


def demo_frames(seed: int, frames: int) -> list[tuple[float, np.ndarray, Pose2D]]:
    """A static street seen from an ego vehicle driving along x: (stamp, cloud, ego pose)."""
    scene = driving_scene(seed=seed)
    out = []
    for k in range(frames):
        stamp = k * FRAME_PERIOD_S
        ego = Pose2D(x=EGO_SPEED_MPS * stamp)
        cloud = scene.points.copy()
        cloud[:, 0] -= np.float32(ego.x)
        out.append((stamp, cloud, ego))
    return out


def check_args(args: argparse.Namespace) -> None:
    """Refuse values that would run nothing (and print a NaN median) or never time out."""
    check_seed("--seed", args.seed)
    if args.frames < 1:
        raise ConfigError(f"--frames must be >= 1, got {args.frames}")
    for name in ("frame_timeout_s", "startup_timeout_s"):
        value = getattr(args, name)
        if not (math.isfinite(value) and value > 0):
            raise ConfigError(
                f"--{name.replace('_', '-')} must be a finite number > 0, got {value}"
            )


def run(args: argparse.Namespace) -> int:
    check_args(args)
    return run_in_process(args) if args.in_process else run_dds(args)


def run_dds(args: argparse.Namespace) -> int:
    """The nodes as processes on a private loopback DDS domain, fed frame by frame."""
    from dynshape_perception.testing.session import node_session

    mode = "composed" if args.composed else "separate"
    overrides: dict[str, bool | int | float | str] = {
        "target_profile": args.target,
        "jit.mode": args.jit,
    }
    if args.weights_dir:
        overrides["weights_dir"] = args.weights_dir
    frames = demo_frames(args.seed, args.frames)
    print(f"starting the {mode} nodes on a private DDS domain (loopback, LARGE_DATA)...")
    with node_session(
        mode, overrides=overrides, startup_timeout_s=args.startup_timeout_s
    ) as session:
        print(
            f"ROS_DOMAIN_ID={session.domain_id}; nodes: "
            + ", ".join(p.name for p in session.processes)
        )
        header = f"{'frame':>5} {'points':>7} {'obst':>5} {'tracks':>6} {'agents':>6}"
        header += "".join(f" {c:>13}" for c in DDS_COLUMNS)
        print(header)
        e2e: list[float] = []
        first_ns = DDS_FIRST_STAMP_NS
        for k, (stamp, cloud, ego) in enumerate(frames):
            ns = first_ns + round(stamp * 1e9)
            t = session.frame(cloud, ns, ego, args.frame_timeout_s)
            arrive = t.after_publish_ms
            c = t.counts
            stages = _stage_ms(arrive)
            predicted_ms = arrive[PREDICTED]
            if predicted_ms is not None:
                e2e.append(predicted_ms)
            print(
                f"{k:>5} {cloud.shape[0]:>7} {c.get(DETECTED, '-'):>5} "
                f"{c.get(TRACKED, '-'):>6} {c.get('agents', '-'):>6}"
                + "".join(f" {_fmt(stages[s]):>13}" for s in DDS_COLUMNS)
            )
        session.probe.spin_for(DIAGNOSTICS_WAIT_S)
        print(f"median scan-to-predictions {median(e2e):.1f} ms over DDS ({len(e2e)} frames)")
        for proc in session.processes:
            status = session.probe.status(proc.name)
            if status is None:
                continue
            v = status.values
            compute = ", ".join(
                f"{k.split('.')[1]} {float(val):.1f}"
                for k, val in v.items()
                if k.startswith("latency_ms.") and k.endswith(".mean")
            )
            print(
                f"{proc.name}: compute ms (mean) {compute}; JIT {v.get('jit.calls')} calls, "
                f"{v.get('jit.hits')} specialised, {v.get('jit.compiles_ok')} compiled; "
                f"status: {status.message}"
            )
        codes = session.stop()
    print("nodes stopped: " + ", ".join(f"{n} exit {c}" for n, c in codes.items()))
    return 0 if len(e2e) == len(frames) and not any(codes.values()) else 1


def _stage_ms(arrive: dict[str, float | None]) -> dict[str, float | None]:
    """Scan->obstacles, obstacles->tracks, tracks->predictions and scan->predictions."""
    chain = (DETECTED, TRACKED, PREDICTED)
    starts: list[float | None] = [0.0, arrive[DETECTED], arrive[TRACKED]]
    out: dict[str, float | None] = {}
    for column, start, topic in zip(DDS_COLUMNS, starts, chain, strict=False):
        end = arrive[topic]
        out[column] = None if start is None or end is None else end - start
    out["e2e_ms"] = arrive[PREDICTED]
    return out


def _fmt(ms: float | None) -> str:
    return "lost" if ms is None else f"{ms:.2f}"


def run_in_process(args: argparse.Namespace) -> int:
    with Engine(args.target, JitConfig(mode=args.jit)) as engine:
        pipeline = Pipeline(
            engine["segmenter"], engine["associator"], engine["predictor"], PipelineParams()
        )
        header = f"{'frame':>5} {'points':>7} {'obst':>5} {'tracks':>6} {'agents':>6}"
        header += "".join(f" {s + '_ms':>11}" for s in COLUMNS)
        print(header)
        totals: list[float] = []
        for k, (stamp, cloud, ego) in enumerate(demo_frames(args.seed, args.frames)):
            r = pipeline.process(cloud, stamp, ego)
            c, lat = r.counts, r.latency_ms
            totals.append(lat["total"])
            print(
                f"{k:>5} {c['points']:>7} {c['obstacles']:>5} {c['tracks']:>6} {c['agents']:>6}"
                + "".join(f" {lat[s]:>11.2f}" for s in COLUMNS)
            )
        metrics = engine.metrics.snapshot()
        print(
            f"median frame {median(totals):.1f} ms; JIT: {metrics['calls']} calls, "
            f"{metrics['hits']} specialised, {metrics['compiles_ok']} compiled in background"
        )
        print(f"planned memory at the bounds (bytes): {engine.planned}")
    return 0
