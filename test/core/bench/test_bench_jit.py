"""``bench jit`` end to end on a short stream: the report's shape and its invariants."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import pytest

from dynshape_perception.core.bench import jit
from dynshape_perception.errors import ConfigError

KEYS = {"p50_ms", "p99_ms", "max_ms", "total_s", "compiles", "calling_thread_compile_s"}


def test_stream_is_seeded_long_tailed_and_never_repeats_a_point_count() -> None:
    stream = jit.shape_stream(4000, seed=3)
    assert stream == jit.shape_stream(4000, seed=3)
    points = [c.dims["P"] for c in stream if c.model == "segmenter"]
    assert len(points) == len(set(points)) and min(points) >= 5000 and max(points) <= 150000
    lengths = {c.dims["T"] for c in stream if c.model == "predictor"}
    assert len(lengths) >= 20


def test_open_loop_keeps_the_probe_off_the_clock() -> None:
    stream = jit.shape_stream(6, seed=1)
    inputs: list[list[np.ndarray]] = [[] for _ in stream]
    probed: list[int] = []

    def slow_probe() -> None:
        probed.append(1)
        time.sleep(0.02)

    def served(call: jit.Call, args: list[np.ndarray]) -> tuple[bool, bool]:
        return False, False

    out = jit.open_loop(stream, inputs, np.zeros(len(stream)), served, probe=slow_probe)
    assert len(probed) == len(stream) == out.served_calls
    # 0.12 s of probing; serving a no-op takes microseconds.
    assert out.total_s < 0.01


def test_bench_jit_reports_every_strategy(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "jit.json"
    parser = argparse.ArgumentParser()
    jit.add_arguments(parser)
    args = parser.parse_args(["--calls", "400", "--budget-s", "2", "--json", str(out)])
    assert jit.run(args) == 0
    report = json.loads(out.read_text())
    for name in jit.STRATEGIES:
        assert KEYS <= set(report[name]) and "hit_rate" in report[name]
    assert report["generic"]["compiles"] == 0
    assert report["jit"]["calling_thread_compile_s"] == 0.0
    sync = report["sync_exact"]
    assert sync["extrapolated"], "a 2 s budget cannot compile every exact shape"
    assert sync["compiles"] > report["static_buckets"]["compiles"] > 0
    assert sync["calling_thread_compile_s"] > 2.0
    assert set(report["jit"]["busy_by_model_s"]) == {"segmenter", "predictor"}
    assert report["jit"]["while_compiling"]["calls"] >= 0
    paired = report["jit"]["paired_with_generic"]
    assert sum(g["calls"] for g in paired.values()) == 400
    assert all(g["ratio"] > 0 for g in paired.values())
    warm = report["jit_warm"]
    assert warm["calling_thread_compile_s"] == 0.0 and warm["warm_up_s"] > 0.0
    # The profile's hot keys are built (or loaded) before the warm run's first call.
    assert warm["warm_specialisations"] > 0 and warm["hit_rate"] > 0.0
    assert set(warm["locality"]) == {"grouped_by_key", "stream_order", "with_point_clouds"}
    assert all(row["generic_s"] > 0 and row["jit_s"] > 0 for row in warm["locality"].values())
    cost = warm["dispatch_overhead"]
    assert cost["calls"] > 0 and cost["cold"] > 0 and cost["warm"] > 0
    assert report["generic_repeat"]["compiles"] == 0
    assert set(report["segmenter_exact"]) == {str(p) for p in jit.EXACT_POINTS}
    assert all(ratio > 0 for ratio in report["segmenter_exact"].values())
    printed = capsys.readouterr().out
    assert "generic A/A" in printed
    assert "dispatch overhead" in printed
    assert "extrapolated" in printed


def test_bench_jit_refuses_bad_arguments() -> None:
    parser = argparse.ArgumentParser()
    jit.add_arguments(parser)
    with pytest.raises(ConfigError, match="--strategies"):
        jit.run(parser.parse_args(["--strategies", "jit,eager"]))
    with pytest.raises(ConfigError, match="jit_warm"):
        jit.run(parser.parse_args(["--strategies", "generic,jit_warm"]))
    with pytest.raises(ConfigError, match="--rate"):
        jit.run(parser.parse_args(["--rate", "0"]))
