"""``dynshape-perception report``: a self-contained HTML page of a replay run's metrics."""

from __future__ import annotations

import argparse
from pathlib import Path

from dynshape_perception.cli.main import check_output_file
from dynshape_perception.tools.replay.report import write_report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("run_dir", type=Path, help="run directory written by replay --record")
    parser.add_argument(
        "--out", type=Path, default=None, help="HTML file (default RUN_DIR/report.html)"
    )


def run(args: argparse.Namespace) -> int:
    if args.out is not None:
        check_output_file(args.out, "--out")
    out = write_report(args.run_dir, args.out)
    print(f"report written to {out}")
    return 0
