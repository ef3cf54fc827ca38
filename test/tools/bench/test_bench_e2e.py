"""``bench e2e`` smoke run: small, fast, and the JSON it writes has the documented keys."""

from __future__ import annotations

import json
from pathlib import Path

from dynshape_perception.cli.main import main

SUMMARY_KEYS = {"p50_ms", "p99_ms", "mean_ms", "frames"}


def test_prediction_cost_smoke(tmp_path: Path, cache_root: Path) -> None:
    out = tmp_path / "e2e.json"
    args = ["bench", "e2e", "--mode", "none", "--json", str(out), "--cache-dir", str(cache_root)]
    small = ["--cost-lengths", "2", "5", "--cost-agents", "3", "--cost-repeats", "1"]
    assert main([*args, *small]) == 0
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "e2e" and doc["modes"] == {}
    cost = doc["prediction_cost"]
    assert cost["window"] == 5 and cost["agents"] == 3
    for mode in ("incremental", "full"):
        assert set(cost[mode]) == {"2", "5"}
        for summary in cost[mode].values():
            assert set(summary) == SUMMARY_KEYS
            # One frame per grid point of a predictor step, every agent predicted.
            assert summary["frames"] == 4 and summary["p50_ms"] > 0.0
    assert cost["incremental_ratio_longest_to_shortest"] > 0.0
