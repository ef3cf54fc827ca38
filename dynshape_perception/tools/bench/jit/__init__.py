"""``bench jit``: a seeded long-tail shape stream, open-loop, across the dispatch strategies."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dynshape_perception.errors import ConfigError
from dynshape_perception.tools.bench.jit.report import print_report
from dynshape_perception.tools.bench.jit.strategies import (
    PENDING_REPEATS,
    STRATEGIES,
    JitBenchOptions,
    run_benchmark,
)

__all__ = ["STRATEGIES", "add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    # Long enough for a steady state: the first compiles land seconds into the stream, and
    # the hit rate is judged on the second half.
    parser.add_argument(
        "--calls",
        type=int,
        default=20000,
        help="calls in the stream (the default stream has >= 5000; fewer for quick checks)",
    )
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--rate", type=float, default=0.5, help="arrival rate as a fraction of generic throughput"
    )
    parser.add_argument(
        "--budget-s", type=float, default=120.0, help="compile budget of sync_exact"
    )
    parser.add_argument("--pool-size", type=int, default=1)
    parser.add_argument(
        "--compile-mode",
        choices=("auto", "process", "thread"),
        default="auto",
        help="the runtime's compile pool; auto measures both on the live stream",
    )
    parser.add_argument(
        "--strategies",
        default=",".join(STRATEGIES),
        help="comma-separated subset to run (all by default; jit_warm needs jit)",
    )
    parser.add_argument(
        "--pending-repeats",
        type=int,
        default=PENDING_REPEATS,
        help="more cold starts over the stream's first calls, each between generic passes, "
        "to judge the p99 while compiling (0: none)",
    )
    parser.add_argument("--json", type=Path, default=None, help="write the results here")


def run(args: argparse.Namespace) -> int:
    if args.calls < 1 or not 0.0 < args.rate <= 1.0:
        raise ConfigError("--calls must be >= 1 and --rate in (0, 1]")
    if args.pending_repeats < 0:
        raise ConfigError(f"--pending-repeats must be >= 0, got {args.pending_repeats}")
    strategies = tuple(s.strip() for s in args.strategies.split(",") if s.strip())
    unknown = set(strategies) - set(STRATEGIES)
    if unknown or not strategies:
        raise ConfigError(f"--strategies must name some of {STRATEGIES}, got {args.strategies!r}")
    if "jit_warm" in strategies and "jit" not in strategies:
        raise ConfigError("--strategies: jit_warm starts from the profile and cache jit leaves")
    results = run_benchmark(
        JitBenchOptions(
            calls=args.calls,
            seed=args.seed,
            rate_fraction=args.rate,
            budget_s=args.budget_s,
            pool_size=args.pool_size,
            strategies=strategies,
            compile_mode=args.compile_mode,
            pending_repeats=args.pending_repeats,
        )
    )
    print_report(results, strategies)
    if args.json:
        compact = {
            k: {kk: vv for kk, vv in v.items() if kk != "compile_events"}
            if isinstance(v, dict)
            else v
            for k, v in results.items()
        }
        args.json.write_text(json.dumps(compact, indent=2))
    return 0
