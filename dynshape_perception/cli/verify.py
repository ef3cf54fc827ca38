"""``dynshape-perception verify``: prove a target (aarch64 under emulation, CUDA device code)."""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path
from typing import Any

from dynshape_perception.cli.main import check_output_dir, check_output_file
from dynshape_perception.compiler.cache import ArtefactCache
from dynshape_perception.models import MODEL_NAMES
from dynshape_perception.tools.verify.cuda import CUDA_TARGETS

TARGETS = ("aarch64", *CUDA_TARGETS)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", required=True, choices=TARGETS, help="target profile to prove")
    parser.add_argument("--json", type=Path, help="also write the report here as JSON")
    parser.add_argument(
        "--models", nargs="+", choices=MODEL_NAMES, default=list(MODEL_NAMES), help="models"
    )
    parser.add_argument("--cache-dir", type=Path, help="artefact cache (default: user cache)")
    parser.add_argument(
        "--work-dir", type=Path, help="keep the aarch64 inputs and outputs here (default: temp)"
    )
    parser.add_argument(
        "--no-gpu", action="store_true", help="CUDA: check device code only, even with a GPU"
    )


def run(args: argparse.Namespace) -> int:
    if args.json:
        check_output_file(args.json, "--json")
    if args.work_dir:
        check_output_dir(args.work_dir, "--work-dir")
    if args.cache_dir:
        check_output_dir(args.cache_dir, "--cache-dir")
    cache = ArtefactCache(args.cache_dir)
    report: Any
    if args.target == "aarch64":
        from dynshape_perception.tools.verify import aarch64

        with tempfile.TemporaryDirectory(prefix="dynshape-verify-") as tmp:
            report = aarch64.verify_aarch64(cache, args.work_dir or Path(tmp), args.models)
        text = aarch64.format_report(report)
    else:
        from dynshape_perception.tools.verify import cuda

        report = cuda.verify_cuda(
            args.target, cache, args.models, run_on_gpu=False if args.no_gpu else None
        )
        text = cuda.format_report(report)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n")
    return 0 if report.ok else 1
