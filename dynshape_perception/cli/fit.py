"""``dynshape-perception fit``: fit one model's weights deterministically and record them."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

# First: importing the fit package pins torch's kernels, and TVM imports torch when it loads.
import dynshape_perception.tools.fit  # noqa: F401
from dynshape_perception.models import MODEL_NAMES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", required=True, choices=MODEL_NAMES, help="model to fit")
    parser.add_argument(
        "--data",
        default=None,
        help="comma-separated training data: eth, hotel (../shared/data/eth_ucy), synthetic "
        "(generated); default: eth,hotel,synthetic for the predictor, synthetic otherwise",
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of data, init and batches")
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help="folder for <model>.npz and manifest.yaml (default: the package's models/)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    from dynshape_perception.tools.fit.runner import fit_and_save

    report = fit_and_save(args.model, args.data, args.seed, args.out)
    result = {
        "model": report.model,
        "weights": str(report.path),
        "sha256": report.sha256,
        "fit_command": report.command,
        "fit_s": round(report.seconds, 1),
        "stats": report.stats,
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    print(f"fitted {report.model} in {report.seconds:.1f} s -> {report.path}")
    print(f"sha256 {report.sha256}")
    print(f"reproduce: {report.command}")
    for key, value in report.stats.items():
        print(f"  {key}: {value}")
    return 0
