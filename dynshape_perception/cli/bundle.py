"""``dynshape-perception bundle``: a runtime-only bundle of the artefacts for one target."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dynshape_perception.cli.main import check_output_dir, check_output_file
from dynshape_perception.compiler.cache import ArtefactCache
from dynshape_perception.compiler.targets import available_profiles
from dynshape_perception.models import MODEL_NAMES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, choices=available_profiles(), help="profile")
    parser.add_argument("--out", type=Path, required=True, help="bundle folder (replaced)")
    parser.add_argument(
        "--models", nargs="+", choices=MODEL_NAMES, default=list(MODEL_NAMES), help="models"
    )
    parser.add_argument(
        "--python", help="destination CPython X.Y (default: 3.12 for cuda-hopper, 3.11 for ARM)"
    )
    parser.add_argument("--max-mb", type=float, default=60.0, help="fail above this size")
    parser.add_argument("--cache-dir", type=Path, help="artefact cache (default: user cache)")
    parser.add_argument("--json", type=Path, help="also write the bundle manifest here")


def run(args: argparse.Namespace) -> int:
    from dynshape_perception.tools import bundle

    bundle.check_python(args.python)
    bundle.check_max_mb(args.max_mb)
    check_output_dir(args.out, "--out")
    if args.json:
        check_output_file(args.json, "--json")
    if args.cache_dir:
        check_output_dir(args.cache_dir, "--cache-dir")
    report = bundle.write_bundle(
        args.target,
        args.out,
        ArtefactCache(args.cache_dir),
        args.models,
        python=args.python,
        max_mb=args.max_mb,
    )
    print(bundle.format_report(report))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n")
    return 0
