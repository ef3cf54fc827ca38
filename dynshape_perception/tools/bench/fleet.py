"""``bench fleet``: bags per minute with 1 and N Ray workers, the engine's per-bag overhead, RSS."""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from dynshape_perception.errors import ConfigError
from dynshape_perception.tools.fleet.cluster import RayOptions, dispatch, ray_session, warm_up
from dynshape_perception.tools.fleet.corpus import load_corpus
from dynshape_perception.tools.fleet.corpus_replay import CorpusOptions, make_jobs
from dynshape_perception.tools.fleet.task import OK, EngineSpec
from dynshape_perception.tools.replay import sources
from dynshape_perception.tools.sim.drive import DriveConfig

MS = 1000.0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--bags", type=int, default=8, help="bags in the generated corpus")
    parser.add_argument("--frames", type=int, default=40, help="frames per bag")
    parser.add_argument("--workers", type=int, default=2, help="the most workers compared")
    parser.add_argument(
        "--points", type=int, nargs=2, default=(5_000, 40_000), help="MIN MAX points per scan"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the generated drives")
    parser.add_argument("--cache-dir", type=Path, default=None, help="artefact cache folder")
    parser.add_argument("--json", type=Path, default=None, help="write the results here")


def _corpus(root: Path, args: argparse.Namespace) -> Path:
    for i in range(args.bags):
        config = DriveConfig(
            seed=args.seed + i,
            frames=args.frames,
            points_range=(args.points[0], args.points[1]),
            objects_range=(0, 40),
            agents_range=(0, 16),
        )
        sources.write_generated(root / f"bag{i:03d}", "mcap", config)
    return root


def _median_ms(values: list[float]) -> float:
    return round(statistics.median(values) * MS, 3) if values else 0.0


def measure(outcomes: list[dict[str, Any]], wall_s: float) -> dict[str, Any]:
    """Throughput and the per-bag split of one run: the replay against what the engine adds
    (dispatch to a worker, the result's way back, the engine cache lookup)."""
    bad = [o["name"] for o in outcomes if o["status"] != OK]
    if bad:
        raise ConfigError(f"bench fleet: bags did not replay: {bad}")
    timing = [o["timing"] for o in outcomes]
    dispatch_s = [t["started_s"] - t["submitted_s"] for t in timing]
    transfer_s = [t["received_s"] - t["finished_s"] for t in timing]
    lookup_s = [t["engine_s"] for t in timing]
    replay_s = [t["replay_s"] for t in timing]
    overhead_s = [d + r + c for d, r, c in zip(dispatch_s, transfer_s, lookup_s, strict=True)]
    workers: dict[int, float] = {}
    for o in outcomes:
        pid = o["worker"]["pid"]
        workers[pid] = max(workers.get(pid, 0.0), o["worker"]["peak_rss_mb"])
    return {
        "bags": len(outcomes),
        "wall_s": round(wall_s, 3),
        "bags_per_min": round(len(outcomes) * 60.0 / wall_s, 2),
        "replay_ms_p50": _median_ms(replay_s),
        "dispatch_ms_p50": _median_ms(dispatch_s),
        "transfer_ms_p50": _median_ms(transfer_s),
        "cache_lookup_ms_p50": _median_ms(lookup_s),
        "overhead_ms_p50": _median_ms(overhead_s),
        "overhead_share": round(statistics.median(overhead_s) / statistics.median(replay_s), 4),
        "task_ms_p50": _median_ms([t["finished_s"] - t["started_s"] for t in timing]),
        "workers_used": len(workers),
        "peak_rss_mb": {str(pid): rss for pid, rss in sorted(workers.items())},
    }


def run(args: argparse.Namespace) -> int:
    if args.bags < 1 or args.frames < 1 or args.workers < 1:
        raise ConfigError("--bags, --frames and --workers must be >= 1")
    counts = sorted({1, args.workers})
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as scratch:
        root = Path(scratch)
        corpus = _corpus(root / "corpus", args)
        entries = load_corpus(corpus)
        spec = EngineSpec(cache_dir=args.cache_dir.resolve() if args.cache_dir else None)
        options = CorpusOptions(engine=spec, progress=False)
        runs: dict[str, dict[str, Any]] = {}
        with ray_session(RayOptions(workers=args.workers)) as ray:
            t0 = time.perf_counter()
            warm_up(ray, spec, {})
            compile_s = time.perf_counter() - t0
            # Every worker builds its engine (from the cache) before anything is timed.
            ray.get([ray.remote(num_cpus=1)(_warm).remote(spec) for _ in range(args.workers)])
            for count in counts:
                jobs = make_jobs(entries, root / f"run{count}", options)
                t0 = time.perf_counter()
                outcomes = dispatch(ray, jobs, 0, lambda _: None, max_in_flight=count)
                runs[str(count)] = measure(outcomes, time.perf_counter() - t0)
    one, most = runs["1"], runs[str(counts[-1])]
    results = {
        "benchmark": "fleet",
        "machine": {
            "cpu_count": len(os.sched_getaffinity(0)),
            "cpu_model": _cpu_model(),
            "platform": platform.platform(),
        },
        "corpus": {"bags": args.bags, "frames": args.frames, "points": list(args.points)},
        "compile_and_first_engine_s": round(compile_s, 2),
        "runs": runs,
        "speedup": round(most["bags_per_min"] / one["bags_per_min"], 3),
    }
    print(
        f"corpus: {args.bags} generated bags of {args.frames} frames ({args.points[0]}-"
        f"{args.points[1]} points); compiled and first engine in {compile_s:.1f} s"
    )
    print(
        f"{'workers':>7}{'bags/min':>10}{'replay ms':>11}{'dispatch':>10}{'transfer':>10}"
        f"{'lookup':>8}{'overhead':>10}{'share':>8}  peak RSS MB per worker"
    )
    for count, r in runs.items():
        rss = ", ".join(f"{v:.0f}" for v in r["peak_rss_mb"].values())
        print(
            f"{count:>7}{r['bags_per_min']:>10.2f}{r['replay_ms_p50']:>11.1f}"
            f"{r['dispatch_ms_p50']:>10.2f}{r['transfer_ms_p50']:>10.2f}"
            f"{r['cache_lookup_ms_p50']:>8.3f}{r['overhead_ms_p50']:>10.2f}"
            f"{r['overhead_share']:>8.2%}  {rss}"
        )
    print(f"speed-up with {counts[-1]} workers: x{results['speedup']:.2f}")
    if args.json is not None:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


def _warm(spec: EngineSpec) -> int:
    from dynshape_perception.tools.fleet.task import warm_engine

    warm_engine(spec, {})
    time.sleep(1.0)  # holds the CPU, so each warm-up task lands on its own worker
    return os.getpid()


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"
