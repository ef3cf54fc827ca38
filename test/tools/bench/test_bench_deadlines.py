"""``bench deadlines`` end to end at a small size: it runs, and its report has every section."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from dynshape_perception.cli.main import main
from dynshape_perception.runtime.cpu_latency import DEVICE
from dynshape_perception.scheduling.tiers import TIERS

TIER_KEYS = {"deadline_ms", "p99_ms", "misses", "dropped", "completed"}


@pytest.mark.slow
def test_bench_deadlines_reports_both_executors_at_both_rates(
    shared_data: Path, tmp_path: Path
) -> None:
    """A fraction of a second per executor and rate; the numbers are the host's, only their
    shape and their bookkeeping are checked."""
    out = tmp_path / "deadlines.json"
    args = ["bench", "deadlines", "--duration-s", "0.3", "--prediction-frames", "40"]
    args += ["--no-realtime", "--cpu-latency-us", "3", "--json", str(out)]
    assert main(args) == 0
    report = json.loads(out.read_text())
    assert {"tiered", "fifo", "setup", "diagnostics", "incremental", "speculation"} <= set(report)
    for executor in ("tiered", "fifo"):
        assert set(report[executor]) == {"1x", "2x"}
        for rate in ("1x", "2x"):
            rows = report[executor][rate]
            assert set(rows) == {str(int(t)) for t in TIERS}
            for row in rows.values():
                assert TIER_KEYS <= set(row)
                assert min(row["misses"], row["dropped"], row["completed"]) >= 0
    setup = report["setup"]
    assert setup["duration_s_per_run"] == 0.3 and setup["rates_hz"]
    held = os.access(DEVICE, os.W_OK)
    assert setup["machine"]["cpu_latency"]["requested_us"] == 3
    assert setup["machine"]["cpu_latency"]["held"] is held
    assert bool(setup["machine"]["cpu_latency"]["refused"]) is not held
    for agents in ("8", "32", "128"):
        assert report["incremental"][agents]["speedup"] > 0.0
    for dataset in ("eth", "hotel"):
        row = report["speculation"][dataset]
        assert 0.0 <= row["acceptance_rate"] <= 1.0 and 0 < row["frames"] <= 40
