"""``dynshape-perception <verb>``: the one command-line entry point besides the ROS nodes."""

from __future__ import annotations

import argparse
import importlib
import logging
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from dynshape_perception.errors import ConfigError, DynshapeError

# verb -> (module under dynshape_perception.cli, one-line help). Modules load lazily so that
# `--help` and light verbs never pay for importing TVM, OpenCV or rclpy.
VERBS: dict[str, tuple[str, str]] = {
    "demo": ("demo", "run the pipeline on a built-in generated scene and print per-stage results"),
    "compile": ("compile", "compile models for a target profile into exported libraries"),
    "cache": ("cache", "show what the artefact cache holds on disk, and prune it to a size"),
    "fit": ("fit", "fit model weights deterministically and write them under models/"),
    "evaluate": (
        "evaluate",
        "evaluate prediction (ETH/UCY), segmentation (KITTI), tracking or detection",
    ),
    "bench": ("bench", "benchmarks: kernels, jit, e2e, deadlines"),
    "verify": ("verify", "prove a target: aarch64 under emulation, CUDA device code"),
    "bundle": ("bundle", "write a runtime-only bundle for a target"),
    "make-bag": ("make_bag", "write rosbag2 bags (mcap, sqlite3) from generated or real data"),
    "replay": ("replay", "replay a rosbag2 bag through the pipeline"),
    "report": ("report", "write an HTML report of a replay run directory"),
    "tune": ("tune", "tune node parameters against bags with Optuna"),
    "fleet": ("fleet", "replay a corpus of bags on Ray, one task per bag"),
    "params": ("params", "print the node parameter table as Markdown"),
}


def check_output_file(path: Path, what: str = "output file") -> Path:
    """Refuse an output path that cannot be written before any slow work, not after it."""
    if path.is_dir():
        raise ConfigError(f"{what} {path} is a folder")
    parent = path.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        raise ConfigError(f"{what} {path}: {parent} is not a folder")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {path}: {parent} is not writable")
    return path


def check_output_dir(path: Path, what: str = "output folder") -> Path:
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{what} {path} exists and is not a folder")
    check_output_file(path / "_", what)
    return path


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dynshape-perception", description=__doc__)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level")
    sub = parser.add_subparsers(dest="verb", metavar="VERB")
    for verb, (_, text) in VERBS.items():
        sub.add_parser(verb, help=text, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    known, rest = parser.parse_known_args(argv)
    logging.basicConfig(
        level=logging.INFO if known.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if known.verb is None:
        parser.print_help()
        return 2
    module_name, text = VERBS[known.verb]
    module = importlib.import_module(f"dynshape_perception.cli.{module_name}")
    verb_parser = argparse.ArgumentParser(
        prog=f"dynshape-perception {known.verb}", description=text
    )
    module.add_arguments(verb_parser)
    args = verb_parser.parse_args(rest)
    try:
        return int(module.run(args))
    except DynshapeError as err:
        # A message may quote a parser's (YAML's) several lines: the error stays one line.
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        # The reader (e.g. `| head`) went away: not an error of ours.
        sys.stderr.close()
        return 0
    except OSError as err:
        # A path the user named cannot be written or read (exists, is a folder, too long...).
        logging.getLogger(__name__).info("%s failed", known.verb, exc_info=True)
        print(f"error: {_one_line(err)}", file=sys.stderr)
        return 2


def _one_line(err: Exception) -> str:
    text = str(err) or type(err).__name__
    return " ".join(text.split())


if __name__ == "__main__":
    sys.exit(main())
