"""``dynshape-perception demo``: the pipeline on a generated scene with the default x86 profile."""

from __future__ import annotations

import argparse

import numpy as np

from dynshape_perception.core.perception.pipeline import Pipeline, PipelineParams, Pose2D
from dynshape_perception.core.runtime.engine import Engine
from dynshape_perception.core.runtime.policy import JitConfig
from dynshape_perception.core.scenes import driving_scene

EGO_SPEED_MPS = 5.0
FRAME_PERIOD_S = 0.1
COLUMNS = ("segment", "cluster", "track", "predict", "total")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--frames", type=int, default=20, help="frames to process")
    parser.add_argument("--seed", type=int, default=7, help="scene seed")
    parser.add_argument("--target", default="x86_64", help="target profile")
    parser.add_argument("--jit", choices=("off", "adaptive"), default="adaptive")


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


def run(args: argparse.Namespace) -> int:
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
            f"median frame {np.median(totals):.1f} ms; JIT: {metrics['calls']} calls, "
            f"{metrics['hits']} specialised, {metrics['compiles_ok']} compiled in background"
        )
        print(f"planned memory at the bounds (bytes): {engine.planned}")
    return 0
