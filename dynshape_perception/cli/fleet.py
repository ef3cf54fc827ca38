"""``dynshape-perception fleet replay``: a corpus of bags replayed on Ray, one task per bag."""

from __future__ import annotations

import argparse
from pathlib import Path

from dynshape_perception.cli.main import check_output_dir
from dynshape_perception.errors import ConfigError
from dynshape_perception.io.bags import STORAGES

EPILOG = (
    "Exit status: 0 every bag replayed (and matched its golden output); 1 a bag regressed "
    "against its golden output; 2 bad arguments; 3 a bag could not be replayed; 130 Ctrl-C."
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.epilog = EPILOG
    sub = parser.add_subparsers(dest="action", metavar="ACTION", required=True)
    replay = sub.add_parser(
        "replay", help="replay every bag of a corpus, one Ray task per bag", epilog=EPILOG
    )
    replay.add_argument(
        "corpus", type=Path, help="folder of rosbag2 bags (any depth) or a manifest YAML"
    )
    replay.add_argument("--out", type=Path, required=True, help="run folder to write or resume")
    add_ray_arguments(replay)
    replay.add_argument("--config", type=Path, default=None, help="ROS params YAML")
    replay.add_argument(
        "--golden", type=Path, default=None, help="folder of golden folders, one per bag name"
    )
    replay.add_argument("--max-frames", type=int, default=None, help="stop each bag after N")
    replay.add_argument("--storage", choices=sorted(STORAGES), default="mcap", help="record as")
    replay.add_argument("--redo", action="store_true", help="replay complete bags again too")
    replay.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_engine_arguments(replay)


def add_ray_arguments(parser: argparse.ArgumentParser) -> None:
    ray = parser.add_argument_group("Ray")
    ray.add_argument(
        "--address",
        default=None,
        help="an existing cluster: auto or HOST:PORT (default: Ray embedded in this process)",
    )
    ray.add_argument(
        "--workers", type=int, default=None, help="CPUs of the embedded Ray (default: all)"
    )
    ray.add_argument(
        "--retries", type=int, default=3, help="reruns of a task whose worker died (default 3)"
    )


def add_engine_arguments(parser: argparse.ArgumentParser) -> None:
    engine = parser.add_argument_group("engine (paths every node can read)")
    engine.add_argument("--target", default=None, help="target profile (default x86_64)")
    engine.add_argument("--cache-dir", type=Path, default=None, help="artefact cache folder")
    engine.add_argument("--weights-dir", type=Path, default=None, help="weights and manifest")


def _absolute(path: Path | None) -> Path | None:
    return None if path is None else path.resolve()


def run(args: argparse.Namespace) -> int:
    from dynshape_perception.tools.fleet import results
    from dynshape_perception.tools.fleet.cluster import RayOptions, check_options
    from dynshape_perception.tools.fleet.corpus import load_corpus
    from dynshape_perception.tools.fleet.corpus_replay import CorpusOptions, replay_corpus
    from dynshape_perception.tools.fleet.task import EngineSpec
    from dynshape_perception.tools.replay.params import load_params_file
    from dynshape_perception.tools.replay.settings import settings_from_values

    if args.max_frames is not None and args.max_frames < 1:
        raise ConfigError(f"--max-frames must be >= 1, got {args.max_frames}")
    ray_options = RayOptions(args.address, args.workers, args.retries)
    check_options(ray_options)
    check_output_dir(args.out, "--out")
    if args.cache_dir:
        check_output_dir(args.cache_dir, "--cache-dir")
    entries = load_corpus(args.corpus, _absolute(args.golden))
    values = load_params_file(args.config) if args.config else {}
    # Checked here, before any task: a bad value would fail every bag alike.
    settings_from_values(values, "off", args.target)
    options = CorpusOptions(
        values=values,
        engine=EngineSpec(args.target, _absolute(args.cache_dir), _absolute(args.weights_dir)),
        storage=args.storage,
        max_frames=args.max_frames,
        redo=args.redo,
        progress=not args.no_progress,
    )
    document = replay_corpus(str(args.corpus), entries, args.out, options, ray_options)
    t = document["totals"]
    print(
        f"{t['bags']} bags: {t['ok']} ok, {t['regressed']} regressed, {t['failed']} failed, "
        f"{t['empty']} with nothing to replay ({t['reused']} kept); {t['frames']} frames on "
        f"{len(document['nodes'])} node(s)"
    )
    for row in document["bags"]:
        if row["status"] not in ("ok", "empty"):
            print(f"  {row['name']}: {row['status']}: {row['reason'] or row['golden']}")
    print(f"summary in {args.out / results.SUMMARY_FILE}, report in {args.out / 'report.html'}")
    return results.exit_status(document)
