"""``dynshape-perception replay``: a rosbag2 bag through the pipeline, in process or over DDS."""

from __future__ import annotations

import argparse
import importlib.metadata
import math
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dynshape_perception.errors import ConfigError
from dynshape_perception.io import bags
from dynshape_perception.io.bags import STORAGES
from dynshape_perception.io.qos import load_overrides
from dynshape_perception.io.topics import (
    TopicPlan,
    absolute_name,
    parse_remaps,
    plan_topics,
)
from dynshape_perception.tools.replay import golden
from dynshape_perception.tools.replay.metrics import FrameRecord, RunMetrics
from dynshape_perception.tools.replay.params import (
    Value,
    deadlines_from,
    dump_params,
    load_params_file,
)
from dynshape_perception.tools.replay.rundir import RunRecorder

# The engine (TVM) loads only once a bag proves to have something to replay.
if TYPE_CHECKING:
    from dynshape_perception.runtime.engine import Engine
    from dynshape_perception.tools.replay.inprocess import ReplayResult
    from dynshape_perception.tools.replay.settings import ReplaySettings

EXIT_GOLDEN_FAILED = 1
# A replay that replayed nothing (no usable topic, --topics naming none of the bag's, a
# --start-offset past the end) says why and fails: a run that checks nothing must not pass.
EXIT_NOTHING_REPLAYED = 2
DDS_STAGES = ("detected_objects", "tracked_objects", "predicted_objects")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("bag", type=Path, help="rosbag2 bag folder (mcap or sqlite3)")
    parser.add_argument("--mode", choices=("inprocess", "dds"), default="inprocess")
    parser.add_argument(
        "--rate",
        type=float,
        default=None,
        help="time scale (dds default 1.0; inprocess default: as fast as possible)",
    )
    parser.add_argument("--loop", action="store_true", help="replay again from the start")
    parser.add_argument("--start-offset", type=float, default=0.0, help="skip the first S seconds")
    parser.add_argument("--topics", nargs="+", default=None, help="replay only these topics")
    parser.add_argument(
        "--remap",
        nargs="+",
        default=[],
        metavar="FROM:=TO",
        help="rename topics, e.g. /velodyne_points:=points",
    )
    parser.add_argument("--config", type=Path, default=None, help="ROS params YAML")
    parser.add_argument("--record", type=Path, default=None, help="run directory to write")
    parser.add_argument("--storage", choices=sorted(STORAGES), default="mcap", help="record as")
    parser.add_argument("--force", action="store_true", help="replace an existing run directory")
    parser.add_argument("--check", type=Path, default=None, help="golden folder to compare with")
    parser.add_argument("--write-golden", type=Path, default=None, help="store outputs as golden")
    parser.add_argument("--max-frames", type=int, default=None, help="stop after N frames")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    engine = parser.add_argument_group("in-process engine")
    engine.add_argument(
        "--jit",
        choices=("off", "frozen", "adaptive"),
        default=None,
        help="JIT mode (default off; frozen when the params say so); adaptive is not deterministic",
    )
    engine.add_argument("--jit-shapes", type=Path, default=None, help="shape log to freeze")
    engine.add_argument(
        "--record-shapes", type=Path, default=None, help="write the run's shape log"
    )
    engine.add_argument("--target", default=None, help="target profile (default x86_64)")
    engine.add_argument("--cache-dir", type=Path, default=None, help="artefact cache folder")
    engine.add_argument("--weights-dir", type=Path, default=None, help="weights and manifest")
    dds = parser.add_argument_group("dds")
    dds.add_argument("--clock-hz", type=float, default=100.0, help="/clock rate between messages")
    dds.add_argument(
        "--wait-for-subscribers",
        type=float,
        default=0.0,
        metavar="S",
        help="wait up to S seconds for a subscriber of the points (else of every topic)",
    )
    dds.add_argument(
        "--qos-profile-overrides-path",
        type=Path,
        default=None,
        metavar="YAML",
        help="QoS to offer per topic instead of the recorded one, as ros2 bag play takes it "
        "(topic: {reliability, durability, history, depth})",
    )


def build_engine(
    settings: ReplaySettings, cache_dir: Path | None, weights_dir: Path | None
) -> Engine:
    from dynshape_perception.runtime.engine import Engine

    return Engine(settings.target, settings.jit, cache_dir=cache_dir, weights_dir=weights_dir)


def _values(args: argparse.Namespace) -> dict[str, Value]:
    return load_params_file(args.config) if args.config else {}


def _print_plan(bag: Path, lines: list[str]) -> None:
    print(f"{bag}:")
    print("\n".join(lines) if lines else "  (the bag has no topics)")


def _summary_lines(summary: dict[str, Any]) -> list[str]:
    out = [
        f"frames {summary['frames']} ({summary['dropped_frames']} dropped), simulated "
        f"{summary['sim_s']:.2f} s in {summary['wall_s']:.2f} s wall "
        f"(x{summary['realtime_factor'] or 0:.2f} real time)"
    ]
    for stage, stats in summary.get("latency_ms", {}).items():
        out.append(
            f"  {stage:<12} p50 {stats['p50']:9.2f} ms  p99 {stats['p99']:9.2f} ms  "
            f"max {stats['max']:9.2f} ms"
        )
    misses = ", ".join(f"tier {t}: {n}" for t, n in summary["deadline_misses"].items())
    drops = ", ".join(f"tier {t}: {n}" for t, n in summary["drops"].items())
    out.append(f"deadline misses {misses}")
    out.append(f"drops {drops}")
    p = summary.get("prediction")
    if p and p["matched"] + p["unpredicted"] == 0:
        out.append("prediction: no true agent visible with a future to score against")
    elif p:
        out.append(
            f"prediction: min-ADE {p['min_ade_m']} m over {p['matched']} matched, "
            f"{p['unpredicted']} unpredicted (error with {p['penalty_m']} m penalty: "
            f"{p['error_m']} m)"
        )
    out.append(
        f"JIT hit rate {summary['hit_rate']:.2%}, {summary['compile_events']} compile events"
    )
    return out


def _run_info(
    args: argparse.Namespace, jit: str | None, target: str | None, ignored: tuple[str, ...]
) -> dict[str, Any]:
    return {
        "package_version": _version(),
        "bag": str(args.bag),
        "mode": args.mode,
        "jit": jit,
        "deterministic": args.mode == "inprocess" and jit in ("off", "frozen"),
        "target": target,
        "rate": args.rate,
        "loop": args.loop,
        "start_offset_s": args.start_offset,
        "topics": args.topics,
        "remaps": args.remap,
        "ignored_parameters": list(ignored),
    }


def _version() -> str:
    try:
        return importlib.metadata.version("dynshape_perception")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def _inspect(args: argparse.Namespace, remaps: dict[str, str]) -> TopicPlan:
    """The topics to replay, once the bag's checksums (where it has any) say it is whole:
    damage found halfway would leave a run that stops at the damaged part."""
    with bags.BagReader(args.bag) as reader:
        check = reader.verify()
        print(f"integrity of {args.bag}: {check.summary()}")
        return plan_topics(reader.topics(), args.topics, remaps)


def _check_non_negative(name: str, value: float | None) -> None:
    if value is not None and not (math.isfinite(value) and value >= 0):
        raise ConfigError(f"{name} must be finite and >= 0, got {value}")


def run(args: argparse.Namespace) -> int:
    _check_non_negative("--rate", args.rate)
    _check_non_negative("--start-offset", args.start_offset)
    remaps = parse_remaps(args.remap)
    values = _values(args)
    if args.mode == "dds":
        return _run_dds(args, values, remaps)
    if args.qos_profile_overrides_path is not None:
        raise ConfigError("--qos-profile-overrides-path applies to --mode dds only")
    if args.check:
        golden.load_golden(args.check)
    plan = _inspect(args, remaps)
    _print_plan(args.bag, plan.lines())
    if plan.driver is None:
        print("nothing to replay: no usable topic (needs points, or obstacles/detections)")
        return _nothing(_unknown_topics(args, plan) or "the bag has no usable topic")
    from dynshape_perception.tools.replay.settings import params_yaml, settings_from_values

    settings = settings_from_values(values, args.jit, args.target)
    for name in settings.ignored:
        print(f"note: parameter {name} is not used by replay", file=sys.stderr)
    if settings.jit.mode == "frozen" and args.jit_shapes is None:
        profile = settings.values.get("jit.warm_up_shapes")
        if not profile:
            raise ConfigError("--jit frozen needs --jit-shapes (record one with --record-shapes)")
        args.jit_shapes = Path(str(profile))
    if settings.jit.mode == "frozen":
        from dynshape_perception.runtime.shape_log import load_shape_log

        # Read before the engine is built: a bad file fails at once, not after the build.
        load_shape_log(args.jit_shapes)
    from dynshape_perception.tools.replay.inprocess import InProcessReplay, ReplayOptions

    with build_engine(settings, args.cache_dir, args.weights_dir) as engine:
        if settings.jit.mode == "frozen":
            queued = engine.warm_up(args.jit_shapes)
            print(
                f"JIT frozen: {queued} specialisation(s) queued from {args.jit_shapes}, "
                f"{engine.serving()} serving"
            )
        elif settings.jit.mode == "adaptive":
            print("note: adaptive JIT compiles while replaying; outputs may differ between runs")
        options = ReplayOptions(
            topics=tuple(args.topics) if args.topics else None,
            remaps=remaps,
            start_offset_s=args.start_offset,
            rate=args.rate or 0.0,
            loop=args.loop,
            max_frames=args.max_frames,
            progress=not args.no_progress,
        )
        replay = InProcessReplay(engine, settings)
        info = _run_info(args, settings.jit.mode, settings.target, settings.ignored)
        need_outputs = args.record or args.check or args.write_golden
        with tempfile.TemporaryDirectory(prefix="dynshape-replay-") as scratch:
            run_dir = args.record or Path(scratch) / "run"
            result: ReplayResult
            if need_outputs:
                with RunRecorder(run_dir, args.storage, args.force) as recorder:
                    result = replay.run(args.bag, options, recorder, info)
                    recorder.finish(result.metrics.document(), params_yaml(settings))
            else:
                result = replay.run(args.bag, options, None, info)
            if args.record_shapes is not None:
                engine.record_shapes(args.record_shapes)
                print(f"shape log written to {args.record_shapes}")
            print("\n".join(_summary_lines(result.summary())))
            if args.record:
                print(f"run recorded in {args.record}")
            if result.frames == 0 and not result.interrupted:
                return _nothing(_why_no_frame(args, plan.driver.topic))
            return _golden_step(args, run_dir, 130 if result.interrupted and not args.loop else 0)


def _golden_step(args: argparse.Namespace, run_dir: Path, code: int) -> int:
    output = golden.output_bag_of(run_dir)
    if args.write_golden:
        golden.write_golden(output, args.write_golden)
        print(f"golden expectations written to {args.write_golden}")
    if args.check:
        report = golden.check_golden(output, args.check)
        print(report.text(args.check))
        if not report.passed:
            return EXIT_GOLDEN_FAILED
    return code


def _run_dds(args: argparse.Namespace, values: dict[str, Value], remaps: dict[str, str]) -> int:
    from dynshape_perception.nodes import bag_player

    if args.check or args.write_golden:
        raise ConfigError("golden checks need the deterministic in-process mode")
    plan = _inspect(args, remaps)
    options = bag_player.PlayOptions(
        topics=tuple(args.topics) if args.topics else None,
        remaps=remaps,
        rate=args.rate or 1.0,
        loop=args.loop,
        start_offset_s=args.start_offset,
        clock_hz=args.clock_hz,
        wait_for_subscribers_s=args.wait_for_subscribers,
        max_frames=args.max_frames,
        qos_overrides=load_overrides(args.qos_profile_overrides_path)
        if args.qos_profile_overrides_path
        else {},
    )
    driver = plan.driver
    driver_name = driver.name if driver is not None else None

    def show(tracks: list[Any], skipped: list[Any]) -> None:
        lines = [
            f"  publish {t.topic} ({t.msgtype}, {t.count}) on {t.name}: {t.qos}" for t in tracks
        ]
        lines += [f"  skipped {s.topic} ({s.msgtype}): {s.reason}" for s in skipped]
        _print_plan(args.bag, lines)
        if not tracks:
            print("nothing to publish: no topic of a type installed here")

    if args.record is None:
        result = bag_player.replay_dds(args.bag, options, driver_name, None, show)
    else:
        with RunRecorder(args.record, args.storage, args.force) as recorder:
            result = bag_player.replay_dds(
                args.bag,
                options,
                driver_name,
                recorder.write_raw,
                show,
                object_topics=tuple(recorder.object_topics),
            )
            info = _run_info(args, None, None, ())
            metrics = _dds_metrics(result, deadlines_from(values), info)
            recorder.finish(
                metrics.document(), dump_params(values, comment="parameters given to the replay")
            )
        print(f"run recorded in {args.record}")
    total = sum(result.published.values())
    print(f"published {total} messages in {result.wall_s:.2f} s (+ /clock)")
    for topic, count in sorted(result.undecodable.items()):
        print(f"  left out {count} message(s) of {topic} that do not decode as their type")
    for topic, count in sorted(result.received.items()):
        print(f"  received {count} on {topic}")
    if total == 0 and not result.interrupted:
        if driver is None:
            return _nothing(_unknown_topics(args, plan) or "the bag has no usable topic")
        return _nothing(_why_no_frame(args, driver.topic))
    return 130 if result.interrupted and not args.loop else 0


def _nothing(why: str) -> int:
    print(f"nothing replayed: {why}", file=sys.stderr)
    return EXIT_NOTHING_REPLAYED


def _unknown_topics(args: argparse.Namespace, plan: TopicPlan) -> str:
    """What --topics names that the bag does not hold, if anything."""
    held = {absolute_name(t.topic) for t in plan.skipped}
    held |= {absolute_name(u.topic) for u in plan.used.values()}
    unknown = [t for t in args.topics or () if absolute_name(t) not in held]
    return f"--topics {' '.join(unknown)}: no such topic in the bag" if unknown else ""


def _why_no_frame(args: argparse.Namespace, driver: str) -> str:
    if args.start_offset:
        return f"--start-offset {args.start_offset:g} s leaves no message of {driver}"
    return f"no message of {driver} was replayed"


def _dds_metrics(
    result: Any, deadlines_ms: dict[int, float | None], info: dict[str, Any]
) -> RunMetrics:
    """End-to-end latencies per standard output, by the input frame of the same stamp."""
    metrics = RunMetrics(deadlines_ms, info, stages=DDS_STAGES)
    metrics.topics = {
        "used": [{**vars(t), "qos": str(t.qos)} for t in result.tracks],
        "skipped": [vars(s) for s in result.skipped],
    }
    stamps = sorted(result.latency_s)
    for index, stamp in enumerate(stamps):
        latency = {
            topic.strip("/"): seconds * 1e3
            for topic, seconds in result.latency_s[stamp].items()
            if topic.strip("/") in DDS_STAGES
        }
        if latency:
            latency["total"] = max(latency.values())
        metrics.add_frame(
            FrameRecord(
                index=index,
                stamp_ns=stamp,
                t_s=round((stamp - stamps[0]) * 1e-9, 6),
                wall_s=0.0,
                latency_ms=latency,
            )
        )
    return metrics
