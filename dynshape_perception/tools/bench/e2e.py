"""``bench e2e``: scan to predicted objects over DDS, per feature mode; the prediction cost."""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import platform
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from dynshape_perception.errors import ConfigError
from dynshape_perception.io.datasets import read_kitti_bin
from dynshape_perception.perception.pipeline import Pose2D
from dynshape_perception.perception.prediction.settings import MODES as COST_MODES
from dynshape_perception.resources import shared_data_dir
from dynshape_perception.runtime.process_tree import PeakSampler
from dynshape_perception.stats import DIGITS, median, percentile
from dynshape_perception.tools.bench.prediction_cost import LENGTHS
from dynshape_perception.tools.sim.drive import DriveConfig, drive_frames
from dynshape_perception.tools.sim.scenes import sensor_sectors

SETUPS = ("composed", "separate")
INPUTS = ("kitti", "drive")
# Each mode turns one feature on, the others at their defaults (baseline: all off).
MODES: dict[str, dict[str, bool | int | float | str]] = {
    "baseline": {"prediction.mode": "full", "prediction.speculation": False},
    "incremental": {"prediction.mode": "incremental"},
    "speculation": {"prediction.mode": "incremental", "prediction.speculation": True},
    "streaming": {},
}
STREAMING = "streaming"
HEADLINE = ("composed", "kitti")
# The standard outputs of testing.session (imported there with rclpy, only when measuring).
DETECTED, TRACKED, PREDICTED = "detected_objects", "tracked_objects", "predicted_objects"
NEAR = "near_objects"
KITTI_SCAN = Path("lidar") / "kitti_000008.bin"
FIRST_STAMP_NS = 1_000_000_000
STAMP_STEP_NS = 100_000_000
SCAN_PERIOD_S = 0.1
PERCENTILE = 99.0
# Long enough for one /diagnostics report at the default period.
STATUS_WAIT_S = 1.5
PRIME_ATTEMPTS = 5
# The node that predicts, and its diagnostics task (nodes.diagnostics.PREDICTION).
PREDICTING_NODE = {"composed": "perception_pipeline", "separate": "prediction_node"}
PREDICTION_TASK = "prediction"
DRIVE_POINTS = (15_000, 40_000)
# Each node's stages, as it names them on its debug timing topics ("delivery": its input's
# publication to its take by the node; "total": its whole frame from that take).
LIDAR_STAGES = ("delivery", "convert", "near_field", "segment", "cluster")
NODE_STAGES: dict[str, dict[str, tuple[str, ...]]] = {
    "composed": {"perception_pipeline": (*LIDAR_STAGES, "track", "predict", "total")},
    "separate": {
        "pointcloud_node": (*LIDAR_STAGES, "total"),
        "tracker_node": ("delivery", "convert", "track", "total"),
        "prediction_node": ("delivery", "convert", "predict", "total"),
    },
}
# The topics in the order a frame reaches them; a hop is from one to the next.
HOPS = (DETECTED, TRACKED, PREDICTED)
# A run in brief: the mode's headline, and each run of a round.
BRIEF = ("p50_ms", "p99_ms", "frames", "lost")
# Each node's time comes in just after its output: wait this long for the last of them.
STAGE_WAIT_S = 1.0


@dataclass(frozen=True)
class Scan:
    """One input frame: the cloud and the vehicle's pose at its stamp."""

    points: np.ndarray
    pose: Pose2D


class IdleCollections:
    """The harness's own garbage collections kept out of the frames it times.

    Its probe stamps each arrival in a Python callback: a collection there (0.1-3 ms in
    the harness, measured) would be counted as the nodes' latency. Objects made while
    warming up are frozen; collection is off while a frame is in flight and runs between
    frames instead. ``in_frames`` counts the collections that still ran inside one.
    """

    def __init__(self) -> None:
        self.in_frames = 0
        self.between = 0
        self._timing = False

    def __enter__(self) -> IdleCollections:
        gc.callbacks.append(self._seen)
        return self

    def __exit__(self, *_: object) -> None:
        gc.callbacks.remove(self._seen)
        gc.enable()
        gc.unfreeze()

    def _seen(self, phase: str, _: dict[str, int]) -> None:
        if phase == "start" and self._timing:
            self.in_frames += 1

    def warmed_up(self) -> None:
        """Freeze what warming up made, at the first warm-up frame that came back. The full
        collection walks the harness's whole heap, hundreds of MB, and leaves the shared
        caches cold: the nodes' next frame took 1.2-1.8x the median in every stage, so
        warm-up frames follow it."""
        gc.collect()
        gc.freeze()

    @contextmanager
    def timed(self) -> Iterator[None]:
        gc.disable()
        self._timing = True
        try:
            yield
        finally:
            self._timing = False
            gc.enable()

    def idle(self) -> None:
        """Between frames: what the frame left for the young generations."""
        gc.collect(1)
        self.between += 1


class Pacer:
    """When each scan goes out: at ``rate_hz``, as a lidar's driver sends them, or, at 0,
    as soon as the previous one's predictions are back (closed loop).

    A scan whose predecessor ran past its period goes out at once, and the ones after it
    keep the period from there: no burst to catch up, which a driver never sends.
    """

    def __init__(self, rate_hz: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not math.isfinite(rate_hz) or rate_hz < 0.0:
            raise ConfigError(f"--rate-hz must be 0 (closed loop) or positive, got {rate_hz}")
        self.period_s = 1.0 / rate_hz if rate_hz else 0.0
        self._clock = clock
        self._due_s: float | None = None

    def wait_s(self) -> float:
        """Seconds until the next scan is due; from then on, the one after it."""
        if not self.period_s:
            return 0.0
        now = self._clock()
        due = now if self._due_s is None else max(self._due_s, now)
        self._due_s = due + self.period_s
        return due - now


def jit_activity(statuses: dict[str, dict[str, str]]) -> dict[str, int]:
    """Compiles (landed, failed or rejected) and compile worker starts, summed over the nodes
    and their engines since they started: each one's work runs beside the frames."""
    totals = {"compiles": 0, "worker_starts": 0}
    for values in statuses.values():
        for key, value in values.items():
            engine, _, counter = key.partition(".")
            if engine != "jit" and not engine.startswith("jit_"):
                continue
            if counter in ("compiles_ok", "compiles_failed", "compiles_rejected"):
                totals["compiles"] += int(value)
            elif counter == "compile_worker_starts":
                totals["worker_starts"] += int(value)
    return totals


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--modes", nargs="+", choices=list(MODES), default=list(MODES))
    parser.add_argument("--setups", nargs="*", choices=SETUPS, default=list(SETUPS))
    # The generated drive doubles the node runs: at most 5 minutes by default (docs/benchmarks.md).
    parser.add_argument("--inputs", nargs="+", choices=INPUTS, default=["kitti"])
    parser.add_argument("--sectors", type=int, default=36, help="sectors a scan is cut into")
    parser.add_argument(
        "--prediction-cost",
        choices=("stage", "node", "both", "none"),
        default="stage",
        help="per-frame prediction cost at history lengths 8, 32, 128: through the stage "
        "in process (default), through prediction_node over DDS (node: minutes per repeat)",
    )
    parser.add_argument(
        "--cost-lengths", type=int, nargs="+", default=list(LENGTHS), help="history lengths"
    )
    parser.add_argument("--cost-agents", type=int, default=32, help="agents of every frame")
    parser.add_argument("--cost-repeats", type=int, default=3, help="scenes per length")
    parser.add_argument("--frames", type=int, default=50, help="measured frames per run")
    parser.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="runs of every setup and input, the setups in turn first and last: the host's "
        "drift over a sitting then weighs on each alike (per-round p50s and their ratio)",
    )
    parser.add_argument("--warmup", type=int, default=5, help="frames sent before measuring")
    parser.add_argument(
        "--rate-hz",
        type=float,
        default=0.0,
        help="scans a second, as a lidar sends them; 0 (default): each scan once the previous "
        "one's predictions are back (closed loop)",
    )
    parser.add_argument("--scan", type=Path, default=None, help="KITTI .bin scan to publish")
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated drive")
    parser.add_argument("--params-file", type=Path, default=None, help="node parameters YAML")
    parser.add_argument("--weights-dir", default="", help="weights folder (default: committed)")
    parser.add_argument("--cache-dir", default="", help="artefact cache folder of the nodes")
    parser.add_argument("--jit", choices=("off", "frozen", "adaptive"), default=None)
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="a node parameter over --params-file, VALUE read as YAML (repeatable): "
        "--set jit.start_workers=true",
    )
    parser.add_argument("--frame-timeout-s", type=float, default=10.0)
    parser.add_argument("--startup-timeout-s", type=float, default=180.0)
    parser.add_argument("--json", type=Path, default=None, help="write the results here")


def _kitti(path: Path | None, count: int) -> list[Scan]:
    if path is None:
        data = shared_data_dir()
        if data is None:
            raise ConfigError("no --scan given and ../shared/data is absent")
        path = data / KITTI_SCAN
    points = read_kitti_bin(path, allow_empty=False)
    return [Scan(points, Pose2D())] * count


def _drive(seed: int, count: int) -> list[Scan]:
    """A generated 10 Hz drive along one street: tracks live through the whole run."""
    config = DriveConfig(
        seed=seed,
        frames=count,
        period_s=SCAN_PERIOD_S,
        segment_frames=count,
        points_range=DRIVE_POINTS,
    )
    return [Scan(f.points, Pose2D(*f.pose)) for f in drive_frames(config)]


def summary(latencies_ms: list[float]) -> dict[str, float]:
    values = np.asarray(latencies_ms, dtype=np.float64)
    if values.size == 0:
        return {"p50_ms": float("nan"), "p99_ms": float("nan"), "max_ms": float("nan")}
    return {
        "p50_ms": round(median(values), DIGITS),
        "p99_ms": round(percentile(values, PERCENTILE), DIGITS),
        "mean_ms": round(float(values.mean()), DIGITS),
        "max_ms": round(float(values.max()), DIGITS),
    }


def parameter_overrides(items: Sequence[str]) -> dict[str, bool | int | float | str]:
    """``NAME=VALUE`` pairs as node parameters, each value typed as YAML types it and
    checked as the node checks it (an integer serves where a number is wanted)."""
    from dynshape_perception import parameters

    specs = parameters.all_specs()
    overrides: dict[str, bool | int | float | str] = {}
    for item in items:
        name, sep, text = item.partition("=")
        if not sep or name not in specs:
            raise ConfigError(f"--set takes NAME=VALUE of a node parameter, got {item!r}")
        try:
            value = yaml.safe_load(text) if text else ""
        except yaml.YAMLError as err:
            raise ConfigError(f"--set {name}: {text!r} is not a YAML value: {err}") from err
        if type(specs[name].default) is float and type(value) is int:
            value = float(value)
        specs[name].check(value)
        overrides[name] = value
    return overrides


def _overrides(args: argparse.Namespace) -> dict[str, bool | int | float | str]:
    overrides = parameter_overrides(args.set)
    if args.weights_dir:
        overrides["weights_dir"] = str(args.weights_dir)
    if args.cache_dir:
        overrides["model_cache_dir"] = str(args.cache_dir)
    if args.jit:
        overrides["jit.mode"] = args.jit
    return overrides


def _sectors(points: np.ndarray, sectors: int) -> list[np.ndarray]:
    return [p for p in sensor_sectors(points, sectors) if p.shape[0]]


def measure(
    setup: str, mode: str, scans: Sequence[Scan], args: argparse.Namespace
) -> dict[str, Any]:
    """One run: each scan is sent once the previous one's predictions are back and, with
    ``--rate-hz``, once its period has come.

    In the streaming mode a scan goes out as its sectors, spread over the scan period as a
    spinning lidar's driver sends them, and the latency counts from its last sector.
    """
    from dynshape_perception.testing.session import node_session

    streaming = mode == STREAMING
    overrides = {**_overrides(args), **MODES[mode]}
    counts = {len(_sectors(s.points, args.sectors)) for s in scans} if streaming else {1}
    if len(counts) != 1:
        raise ConfigError(f"the scans hold points in different numbers of sectors: {counts}")
    per_revolution = counts.pop()
    overrides["points.sectors_per_revolution"] = per_revolution
    per_topic: dict[str, list[float]] = {DETECTED: [], TRACKED: [], PREDICTED: []}
    per_frame: list[dict[str, Any]] = []
    waiting_cpu_ms: list[float] = []
    lost = 0
    collections = IdleCollections()
    with (
        collections,
        node_session(
            setup,
            params_file=args.params_file,
            overrides=overrides,
            startup_timeout_s=args.startup_timeout_s,
            # As on a vehicle with no RViz attached: nothing reads the markers.
            read_markers=False,
            # Taken once the frame's predictions are in: their arrival times come from the
            # middleware either way. The near field's output, not timed here, comes in the
            # middle of the lidar stages: read at once, it would wake the probe beside them.
            deferred=(DETECTED, TRACKED, NEAR),
        ) as session,
    ):
        from dynshape_perception.testing.stage_times import StageTimes

        stage_times = StageTimes(session.probe, NODE_STAGES[setup])
        stamp = FIRST_STAMP_NS
        # The first warm-up frame that came back, after which the harness froze its objects:
        # the next one is not measured either (IdleCollections.warmed_up).
        frozen_at: int | None = None
        pacer = Pacer(args.rate_hz)
        for k, scan in enumerate(scans):
            if len(per_topic[PREDICTED]) + lost >= args.frames:
                break
            # Idle until the scan is due, serving what comes meanwhile (diagnostics).
            session.probe.spin_for(pacer.wait_s())
            parts = _sectors(scan.points, args.sectors) if streaming else [scan.points]
            step = STAMP_STEP_NS // max(len(parts), 1)
            stamps = [stamp + j * step for j in range(len(parts))]
            with collections.timed():
                timing = session.sectors(
                    parts,
                    stamps,
                    [scan.pose] * len(parts),
                    SCAN_PERIOD_S / len(parts),
                    args.frame_timeout_s,
                    wait_for=(PREDICTED,),
                    # Only the arrival times are measured: reading the outputs' tables took
                    # the harness milliseconds a frame (a predicted path's pose is a row).
                    counted=False,
                )
            # Nor are the messages kept past their frame.
            session.probe.forget(stamps[-1])
            stamp += STAMP_STEP_NS
            arrived = timing.after_publish_ms[PREDICTED] is not None
            # Each node publishes its times (debug.publish_processing_time) just after its
            # output: wait for them, so that none is taken for the next frame's. While
            # warming up, for every stage of every node (a first one may come late or be lost).
            warming = k < args.warmup or frozen_at is None or k == frozen_at + 1
            timed = list(NODE_STAGES[setup]) if warming else stage_times.publishing()
            stage_times.spin_until(partial(stage_times.complete, timed, warming), STAGE_WAIT_S)
            compute = stage_times.take()
            collections.idle()
            if warming:
                # Discovery settles and the models warm up; nothing is measured yet.
                if arrived and frozen_at is None:
                    collections.warmed_up()
                    frozen_at = k
                if k >= args.warmup + PRIME_ATTEMPTS and frozen_at is None:
                    session.check_alive()
                    raise ConfigError(f"no predictions came back in {setup}/{mode}")
                continue
            for topic in per_topic:
                ms = timing.after_publish_ms[topic]
                if ms is not None:
                    per_topic[topic].append(ms)
            lost += not arrived
            waiting_cpu_ms.append(timing.waiting_cpu_ms)
            scan_to = {t: timing.after_publish_ms[t] for t in HOPS}
            if all(v is not None for v in scan_to.values()):
                frame: dict[str, Any] = {
                    "scan_to_ms": scan_to,
                    "compute_ms": compute,
                    "points": int(scan.points.shape[0]),
                }
                published = {t: timing.published_ms[t] for t in HOPS}
                if all(v is not None for v in published.values()):
                    frame["published_ms"] = published
                per_frame.append(frame)
        stage_times.close()
        session.probe.spin_for(float(STATUS_WAIT_S))
        # A loaded host may publish the diagnostics late: wait for every node's.
        session.probe.spin_until(
            lambda: (
                all(session.probe.status(p.name) is not None for p in session.processes)
                and session.probe.task(PREDICTING_NODE[setup], PREDICTION_TASK) is not None
            ),
            args.frame_timeout_s,
        )
        statuses = {proc.name: session.probe.status(proc.name) for proc in session.processes}
        prediction = session.probe.task(PREDICTING_NODE[setup], PREDICTION_TASK)
    measured = len(per_topic[PREDICTED]) + lost
    node_status = {
        name: (status.values if status is not None else {}) for name, status in statuses.items()
    }
    return {
        "frames": measured,
        "lost": lost,
        "sectors_per_revolution": per_revolution,
        **{k: v for k, v in summary(per_topic[PREDICTED]).items() if k in ("p50_ms", "p99_ms")},
        "scan_to": {t: summary(v) for t, v in per_topic.items()},
        "per_hop": per_hop(per_frame, NODE_STAGES[setup]),
        "harness_gc": {"in_frames": collections.in_frames, "between": collections.between},
        "harness_cpu_waiting": summary(waiting_cpu_ms),
        "jit": jit_activity(node_status),
        # What speculation saved, or why nothing (the prediction task's message).
        "prediction_message": prediction.message if prediction is not None else None,
        "node_status": node_status,
    }


def per_hop(frames: Sequence[dict[str, Any]], stages: dict[str, tuple[str, ...]]) -> dict[str, Any]:
    """Of the frames that reached every topic: scan to each topic, each hop, and each node's
    stage times (its debug timing topics); the frames themselves."""
    scan_to = {t: summary([f["scan_to_ms"][t] for f in frames]) for t in HOPS}
    hops = {
        f"{a}->{b}": summary([f["scan_to_ms"][b] - f["scan_to_ms"][a] for f in frames])
        for a, b in pairwise(HOPS)
    }
    compute = {
        node: {
            stage: summary(
                [
                    f["compute_ms"][node][stage]
                    for f in frames
                    if stage in f["compute_ms"].get(node, {})
                ]
            )
            for stage in names
        }
        for node, names in stages.items()
    }
    return {
        "scan_to_ms": scan_to,
        "hop_ms": hops,
        "compute_ms": compute,
        "scan_size": scan_size(frames),
        "frames": list(frames),
    }


def scan_size(frames: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """How much of scan to ``predicted_objects`` the scans' sizes explain.

    A generated drive's scans hold from ``DRIVE_POINTS[0]`` to ``DRIVE_POINTS[1]`` points and
    every lidar stage's cost grows with them, so its slowest frames can be its largest scans
    rather than a pause. A least-squares line, ``fixed_ms`` plus ``ms_per_1k_points``, gives
    each frame's time at the median scan's size; their p50 and p99 are the tail that is left
    (``at_median_points``). Scans that all hold the same points (KITTI) get no line.
    """
    points = np.asarray([f["points"] for f in frames], dtype=np.float64)
    if points.size == 0:
        return {}
    middle = median(points)
    out: dict[str, Any] = {
        "points": {"min": int(points.min()), "p50": round(middle, DIGITS), "max": int(points.max())}
    }
    # One scan, or scans of one size, leave no line to fit.
    if points.min() == points.max():
        return out
    ms = np.asarray([f["scan_to_ms"][PREDICTED] for f in frames], dtype=np.float64)
    slope, fixed = np.polyfit(points / 1000.0, ms, 1)
    at_median = ms - slope * (points - middle) / 1000.0
    out["fixed_ms"] = round(float(fixed), DIGITS)
    out["ms_per_1k_points"] = round(float(slope), DIGITS)
    out["at_median_points"] = {
        "p50_ms": round(median(at_median), DIGITS),
        "p99_ms": round(percentile(at_median, PERCENTILE), DIGITS),
    }
    return out


def print_per_hop(name: str, hop: dict[str, Any]) -> None:
    """Medians: scan to each topic, each hop, and each node's stages."""
    cells = "  ".join(f"{t} {v['p50_ms']:.1f}" for t, v in hop["scan_to_ms"].items())
    print(f"  {name}: scan to {cells} ms (p50, {len(hop['frames'])} frames)")
    cells = "  ".join(f"{t} {v['p50_ms']:.1f}" for t, v in hop["hop_ms"].items())
    print(f"    hops: {cells} ms")
    for node, stages in hop["compute_ms"].items():
        cells = "  ".join(f"{s} {v['p50_ms']:.2f}" for s, v in stages.items())
        print(f"    {node}: {cells} ms")
    size = hop["scan_size"]
    if "at_median_points" in size:
        points, at = size["points"], size["at_median_points"]
        print(
            f"    scans of {points['min']:,}-{points['max']:,} points: to {PREDICTED} "
            f"{size['fixed_ms']:.1f} ms + {size['ms_per_1k_points']:.3f} ms per 1k points; "
            f"at the median scan's {points['p50']:,.0f}, p50 {at['p50_ms']:.1f} and "
            f"p99 {at['p99_ms']:.1f} ms"
        )


def print_rounds(mode: str, entry: dict[str, Any]) -> None:
    """Each round's p50 and p99 per run, then the separate over composed p50 per round."""
    if "rounds" not in entry:
        return
    print(f"{mode}, p50 / p99 ms per round:")
    for name in entry["rounds"][0]:
        cells = "  ".join(
            f"{r[name]['p50_ms']:.1f} / {r[name]['p99_ms']:.1f}" for r in entry["rounds"]
        )
        print(f"  {name:<16}{cells}")
        sized = [r[name].get("at_median_points") for r in entry["rounds"]]
        if any(sized):
            # A round that measured one frame, or none, has no line to move its frames on.
            cells = "  ".join(
                f"{at['p50_ms']:.1f} / {at['p99_ms']:.1f}" if at else "-" for at in sized
            )
            print(f"    at the median scan's size: {cells}")
    for source, ratio in entry["separate_over_composed"].items():
        cells = " ".join(f"{v:.2f}" for v in ratio["per_round"])
        print(f"  separate / composed p50, {source}: {cells} (median {ratio['median']:.2f})")


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


def node_prediction_cost(args: argparse.Namespace) -> dict[str, Any]:
    """Tracked objects published to prediction_node until its predicted objects are back."""
    from dynshape_perception.testing.prediction_session import prediction_session
    from dynshape_perception.tools.bench.prediction_cost import node_cost

    variants = {mode: {"prediction.mode": mode} for mode in COST_MODES}
    overrides = {**_overrides(args), "prediction.history_steps": max(args.cost_lengths)}
    with prediction_session(variants, overrides, startup_timeout_s=args.startup_timeout_s) as s:
        cost = node_cost(s, args.cost_lengths, args.cost_agents, args.cost_repeats)
    return {"path": "prediction_node over DDS, tracked objects to predicted objects", **cost}


def run(args: argparse.Namespace) -> int:
    started = time.monotonic()
    with PeakSampler() as peak:
        code, results = _run(args)
    results["wall_s"] = round(time.monotonic() - started, 1)
    # The harness and every node it started, at the largest sample; the harness alone.
    results["peak_tree_rss_mb"] = round(peak.peak.rss_mb, 1)
    results["peak_harness_rss_mb"] = round(peak.own_peak_bytes / 2**20, 1)
    print(
        f"wall {results['wall_s']} s, peak RSS: {results['peak_harness_rss_mb']} MB the "
        f"harness, {results['peak_tree_rss_mb']} MB with the nodes it started"
    )
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2))
    return code


def round_order(setups: Sequence[str], index: int) -> list[str]:
    """The setups of round ``index`` (from 0), in the order they run: as given, then
    reversed, and so on. One setup run after another meets the host as it has become
    meanwhile, and the host's speed drifts over minutes; taken first and last in turn, the
    setups meet that drift alike."""
    return list(setups) if index % 2 == 0 else list(reversed(setups))


def setup_ratios(rounds: Sequence[dict[str, dict[str, Any]]]) -> dict[str, dict[str, Any]]:
    """Per input, ``separate`` p50 over ``composed`` p50 in each round that ran both and
    measured a frame in each (a run that lost every frame has no p50), and the median of
    those ratios."""
    ratios: dict[str, list[float]] = {}
    for runs in rounds:
        for name, run in runs.items():
            setup, _, source = name.partition("/")
            other = runs.get(f"composed/{source}")
            if setup != "separate" or other is None:
                continue
            ratio = run["p50_ms"] / other["p50_ms"] if other["p50_ms"] > 0.0 else math.nan
            if math.isfinite(ratio):
                ratios.setdefault(source, []).append(ratio)
    return {
        source: {
            "per_round": [round(v, DIGITS) for v in values],
            "median": round(median(np.asarray(values)), DIGITS),
        }
        for source, values in ratios.items()
    }


def round_summary(run: dict[str, Any]) -> dict[str, Any]:
    """A round's run in brief: its p50 and p99, frames, losses and compiles, and where its
    scans differ in size, its p50 and p99 at the median scan's size."""
    out = {k: run[k] for k in BRIEF}
    out["compiles"] = run["jit"]["compiles"]
    at_median = run["per_hop"]["scan_size"].get("at_median_points")
    if at_median is not None:
        out["at_median_points"] = at_median
    return out


def _run(args: argparse.Namespace) -> tuple[int, dict[str, Any]]:
    if args.rounds < 1:
        raise ConfigError(f"--rounds must be at least 1, got {args.rounds}")
    # Before any node starts: a wrong name or type is the caller's, not a node's failure.
    parameter_overrides(args.set)
    if args.params_file is not None:
        from dynshape_perception.tools.replay.params import load_params_file

        # The nodes would each fail to start on it, with rcl's traceback.
        load_params_file(args.params_file)
    count = args.warmup + args.frames + PRIME_ATTEMPTS
    inputs = {
        name: _kitti(args.scan, count) if name == "kitti" else _drive(args.seed, count)
        for name in args.inputs
    }
    modes: dict[str, dict[str, Any]] = {}
    # Every run of every round: each one's lost frames count toward the exit status.
    measured: list[dict[str, Any]] = []
    for mode in args.modes:
        rounds = [
            {
                f"{setup}/{name}": measure(setup, mode, scans, args)
                for setup in round_order(args.setups, index)
                for name, scans in inputs.items()
            }
            for index in range(args.rounds)
        ]
        measured += [run for r in rounds for run in r.values()]
        runs = rounds[0]
        if not runs:
            continue
        head = runs.get("/".join(HEADLINE), next(iter(runs.values())))
        modes[mode] = {k: head[k] for k in BRIEF} | {"runs": runs}
        if args.rounds > 1:
            modes[mode]["rounds"] = [
                {name: round_summary(run) for name, run in sorted(r.items())} for r in rounds
            ]
            modes[mode]["separate_over_composed"] = setup_ratios(rounds)
    results: dict[str, Any] = {
        "benchmark": "e2e",
        "machine": {"cpu_count": _cpu_count(), "platform": platform.platform()},
        "transport": "Fast DDS LARGE_DATA, ROS_AUTOMATIC_DISCOVERY_RANGE=LOCALHOST",
        "figure": "scan (its last sector when streaming) to predicted_objects, "
        + (f"scans at {args.rate_hz:g} Hz" if args.rate_hz else "closed loop"),
        "modes": modes,
    }
    if modes:
        print(
            f"{'mode':<13}{'run':<18}{'frames':>7}{'lost':>6}{'p50_ms':>9}{'p99_ms':>9}"
            f"{'compiles':>10}"
        )
        for mode, entry in modes.items():
            for name, r in entry["runs"].items():
                print(
                    f"{mode:<13}{name:<18}{r['frames']:>7}{r['lost']:>6}"
                    f"{r['p50_ms']:>9.1f}{r['p99_ms']:>9.1f}{r['jit']['compiles']:>10}"
                    f"  {r['prediction_message'] or ''}"
                )
        print("per hop:")
        for mode, entry in modes.items():
            for name, r in entry["runs"].items():
                print_per_hop(f"{mode} {name}", r["per_hop"])
                waiting = r["harness_cpu_waiting"]
                print(
                    f"    harness: {waiting['p50_ms']:.2f} ms CPU a frame while waiting "
                    f"(p50; p99 {waiting['p99_ms']:.2f})"
                )
        for mode, entry in modes.items():
            print_rounds(mode, entry)
    costs = {"stage": stage_prediction_cost, "node": node_prediction_cost}
    wanted = {"both": ("stage", "node"), "none": ()}.get(
        args.prediction_cost, (args.prediction_cost,)
    )
    for path in wanted:
        cost = costs[path](args)
        results[f"prediction_cost_{path}"] = cost
        print(f"prediction cost per frame, {cost['agents']} agents ({cost['path']}):")
        for mode in COST_MODES:
            row = "  ".join(f"T={length}: {v['p50_ms']:.3f} ms" for length, v in cost[mode].items())
            missing = f"  lost: {cost[f'{mode}_lost']}" if f"{mode}_lost" in cost else ""
            print(f"  {mode:<12} {row}{missing}")
    lost = sum(run["lost"] for run in measured)
    node = results.get("prediction_cost_node")
    if node is not None:
        lost += sum(node[f"{mode}_lost"] for mode in COST_MODES)
    return (0 if lost == 0 else 1), results


def _cpu_count() -> int:
    return len(os.sched_getaffinity(0))
