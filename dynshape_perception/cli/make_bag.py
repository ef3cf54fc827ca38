"""``dynshape-perception make-bag``: rosbag2 bags (mcap, sqlite3) for replay testing."""

from __future__ import annotations

import argparse
import math
from pathlib import Path

from tqdm import tqdm

from dynshape_perception.config import check_seed
from dynshape_perception.errors import ConfigError
from dynshape_perception.io.bags import STORAGES
from dynshape_perception.resources import shared_data_dir
from dynshape_perception.tools.replay import sources
from dynshape_perception.tools.sim.drive import DriveConfig

SOURCES = ("generated", "kitti", "eth_ucy", "crowd")
DEFAULT_FRAMES = {"generated": 60, "kitti": 10, "crowd": 40}
DEFAULT_AGENTS_CROWD = 16


def _range(text: str) -> tuple[int, int]:
    lo, sep, hi = text.partition(":")
    try:
        values = (int(lo), int(hi)) if sep else (int(lo), int(lo))
    except ValueError as err:
        raise argparse.ArgumentTypeError(f"expected N or MIN:MAX, got {text!r}") from err
    if not 0 <= values[0] <= values[1]:
        raise argparse.ArgumentTypeError(f"expected 0 <= MIN <= MAX, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--source", choices=SOURCES, required=True, help="what to write")
    parser.add_argument("--out", type=Path, required=True, help="bag folder to create")
    parser.add_argument("--storage", choices=sorted(STORAGES), default="mcap")
    parser.add_argument("--seed", type=int, default=0, help="seed of generated sources")
    parser.add_argument(
        "--frames",
        type=int,
        default=None,
        help="frames (default: generated 60, kitti 10, crowd 40, eth_ucy the whole scene)",
    )
    parser.add_argument(
        "--vision-msgs",
        action="store_true",
        help="also write vision_msgs/Detection3DArray on /detections",
    )
    parser.add_argument(
        "--input",
        type=Path,
        default=None,
        help="KITTI .bin or ETH/UCY .txt (default: ../shared/data)",
    )
    gen = parser.add_argument_group("generated drive")
    gen.add_argument("--points", type=_range, default=(5_000, 150_000), help="MIN:MAX points")
    gen.add_argument("--objects", type=_range, default=(0, 80), help="MIN:MAX objects")
    gen.add_argument(
        "--agents", type=_range, default=None, help="MIN:MAX moving agents (crowd: N agents)"
    )
    gen.add_argument("--segment-frames", type=int, default=20, help="frames per street segment")
    gen.add_argument("--speed", type=float, default=6.0, help="ego speed, m/s")
    gen.add_argument(
        "--sectors",
        type=int,
        default=1,
        help="azimuth sectors a scan is written as (a lidar driver's sector clouds); 1: whole",
    )


def _shared(relative: str) -> Path:
    root = shared_data_dir()
    if root is None:
        raise ConfigError(f"no --input given and ../shared/data is absent (wanted {relative})")
    return root / relative


def run(args: argparse.Namespace) -> int:
    frames: int = args.frames if args.frames is not None else DEFAULT_FRAMES.get(args.source, 0)
    if args.frames is not None and args.frames < 1:
        raise ConfigError(f"--frames must be >= 1, got {args.frames}")
    check_seed("--seed", args.seed)
    if not (math.isfinite(args.speed) and args.speed >= 0):
        raise ConfigError(f"--speed must be finite and >= 0, got {args.speed}")
    if args.source == "generated":
        config = DriveConfig(
            seed=args.seed,
            frames=frames,
            segment_frames=args.segment_frames,
            points_range=args.points,
            objects_range=args.objects,
            agents_range=args.agents or (0, min(64, args.objects[1])),
            ego_speed_mps=args.speed,
        )
        with tqdm(total=frames, unit="frame", desc="make-bag", leave=False, disable=None) as bar:
            summary = sources.write_generated(
                args.out,
                args.storage,
                config,
                args.vision_msgs,
                progress=bar.update,
                sectors=args.sectors,
            )
    elif args.source == "kitti":
        scan = args.input or _shared("lidar/kitti_000008.bin")
        if args.vision_msgs:
            print("note: the KITTI scan has no labels here; no /detections written")
        summary = sources.write_kitti(args.out, args.storage, scan, frames)
    elif args.source == "eth_ucy":
        scene = args.input or _shared("eth_ucy/biwi_eth.txt")
        summary = sources.write_eth_ucy(
            args.out, args.storage, scene, args.frames, args.vision_msgs
        )
    else:
        agents = args.agents[1] if args.agents else DEFAULT_AGENTS_CROWD
        summary = sources.write_crowd(
            args.out, args.storage, args.seed, frames, agents, args.vision_msgs
        )
    print("\n".join(summary.lines()))
    return 0
