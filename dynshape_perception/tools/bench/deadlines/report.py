"""The printed report of ``bench deadlines``."""

from __future__ import annotations

from typing import Any

from dynshape_perception.scheduling.tiers import TIERS
from dynshape_perception.tools.bench.deadlines.prediction import INCREMENTAL_LENGTHS
from dynshape_perception.tools.bench.deadlines.strategies import RATES
from dynshape_perception.tools.bench.deadlines.stream import DATASETS


def print_report(results: dict[str, Any]) -> None:
    setup = results["setup"]
    cal = setup["calibration"]
    print(
        f"sustainable {cal['sustainable_hz']} Hz (mean serial frame {cal['frame_ms']['mean_ms']} "
        f"ms); 1x = {setup['rates_hz']['1x']} Hz, 2x = {setup['rates_hz']['2x']} Hz; "
        f"first chunk {setup['chunk_points']} points; load {setup['machine']['loadavg_before']}"
    )
    latency = setup["machine"]["cpu_latency"]
    if latency["held"]:
        print(f"idle cores held to {latency['requested_us']} µs wake-ups (--cpu-latency-us)")
    elif latency["refused"]:
        print(
            f"CPU latency request refused ({latency['refused']}): cores slept as the kernel chose"
        )
    print(
        f"{'executor':<8}{'rate':>5}{'tier':>5}{'deadline':>10}{'p99_ms':>9}"
        f"{'misses':>8}{'dropped':>9}{'completed':>11}"
    )
    for kind in ("tiered", "fifo"):
        for rate in RATES:
            for tier in TIERS:
                st = results[kind][rate][str(int(tier))]
                print(
                    f"{kind:<8}{rate:>5}{int(tier):>5}{st['deadline_ms']:>10.0f}"
                    f"{st['p99_ms'] if st['p99_ms'] is not None else '-':>9}"
                    f"{st['misses']:>8}{st['dropped']:>9}{st['completed']:>11}"
                )
            stalls = results["diagnostics"][kind][rate]["platform_stalls"]
            print(
                f"{'':<8}{rate:>5} platform stalls > {stalls['over_ms']} ms during the run: "
                f"{stalls['count']} (max {stalls['max_ms']} ms)"
            )
    inc = results["incremental"]
    for length in INCREMENTAL_LENGTHS:
        row = inc[str(length)]
        print(
            f"T={length:<4} incremental {row['incremental_ms']:.3f} ms, full {row['full_ms']:.3f} "
            f"ms, speedup x{row['speedup']}"
        )
    for dataset in DATASETS:
        row = results["speculation"][dataset]
        print(
            f"{dataset}: acceptance {row['acceptance_rate']:.3f} ({row['accepted']}/"
            f"{row['verified']}; {row['promoted_frames']} of {row['frames']} frames without a "
            f"step), saved {row['saved_ms_per_frame']:.4f} ms/frame of "
            f"{row['critical_plain']['mean_ms']:.3f}, "
            f"idle {row['idle_speculate']['mean_ms']:.3f} ms"
        )


def print_sweep(results: dict[str, Any]) -> None:
    for radius, rows in results["speculation"]["radius_sweep"].items():
        text = "; ".join(
            f"{d} acceptance {r['acceptance_rate']:.3f}, no-call frames "
            f"{r['frames_without_any_call']}, saved {r['saved_ms_per_frame']:.4f} ms, idle "
            f"{r['idle_speculate_mean_ms']:.2f} ms"
            for d, r in rows.items()
        )
        print(f"  radius {radius}: {text}")
