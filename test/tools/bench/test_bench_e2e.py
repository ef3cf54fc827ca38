"""``bench e2e`` smoke run: small, fast, and the JSON it writes has the documented keys."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from dynshape_perception.cli.main import main
from dynshape_perception.io.datasets import read_kitti_bin

SUMMARY_KEYS = {"p50_ms", "p99_ms", "mean_ms", "frames"}
MODE_KEYS = {"p50_ms", "p99_ms", "frames", "lost", "runs"}
TOPICS = ("detected_objects", "tracked_objects", "predicted_objects")
LIDAR_STAGES = {"delivery", "convert", "near_field", "segment", "cluster", "total"}


def kitti_points(path: Path) -> int:
    return int(read_kitti_bin(path).shape[0])


def check_per_hop(
    hop: dict[str, Any], frames: int, stages: dict[str, set[str]], whole: bool, points: int
) -> None:
    """The breakdown's fields, and per frame what causality makes true whatever the load:
    each topic is published after the one before it and received after it is published, and
    the stages a node times between taking its input and publishing its output fit between
    the scan and that output (for the lidar stages only with ``whole`` scans: a sectored
    scan's are summed over its sectors). The order in which the probe receives two topics is
    not among them: its middleware threads take them in as they get a core. Every frame
    sent the same scan of ``points`` points, which leaves the scans' size nothing to
    explain."""
    assert set(hop) == {"scan_to_ms", "hop_ms", "compute_ms", "scan_size", "frames"}
    assert hop["scan_size"] == {"points": {"min": points, "p50": points, "max": points}}
    assert set(hop["scan_to_ms"]) == set(TOPICS)
    assert set(hop["hop_ms"]) == {
        "detected_objects->tracked_objects",
        "tracked_objects->predicted_objects",
    }
    assert {n: set(s) for n, s in hop["compute_ms"].items()} == stages
    assert 1 <= len(hop["frames"]) <= frames
    # Stages timed before the output named is published (the lidar node's: from the scan's
    # publication, which the probe timed from just before its publish call).
    before = {
        "detected_objects": ("delivery", "convert", "segment", "cluster"),
        "tracked_objects": ("track",),
        "predicted_objects": ("predict",),
    }
    for frame in hop["frames"]:
        assert frame["points"] == points
        scan_to, published = frame["scan_to_ms"], frame["published_ms"]
        detected, tracked, predicted = (published[t] for t in TOPICS)
        assert 0.0 < detected <= tracked <= predicted, published
        assert all(published[t] <= scan_to[t] for t in TOPICS), (published, scan_to)
        # Every node timed every frame (a stage on another lane may come in after it).
        assert set(frame["compute_ms"]) == set(stages)
        for node, times in frame["compute_ms"].items():
            assert "total" in times and set(times) <= stages[node], (node, times)
            assert all(ms >= 0.0 for ms in times.values()), (node, times)
            for topic, names in before.items():
                if topic == "detected_objects" and not whole:
                    continue
                if all(name in times for name in names):
                    assert sum(times[n] for n in names) <= published[topic], (node, times)
    for node, times in hop["compute_ms"].items():
        for stage, summary in times.items():
            assert 0.0 <= summary["p50_ms"] <= summary["max_ms"], (node, stage)
    for topic in TOPICS:
        summary = hop["scan_to_ms"][topic]
        assert 0.0 < summary["p50_ms"] <= summary["max_ms"]


def test_prediction_cost_smoke(tmp_path: Path, cache_root: Path) -> None:
    out = tmp_path / "e2e.json"
    args = ["bench", "e2e", "--modes", "baseline", "--setups", "--inputs", "kitti"]
    small = ["--cost-lengths", "2", "5", "--cost-agents", "3", "--cost-repeats", "1"]
    common = ["--json", str(out), "--cache-dir", str(cache_root), "--prediction-cost", "stage"]
    assert main([*args, *common, *small]) == 0
    doc = json.loads(out.read_text())
    assert doc["benchmark"] == "e2e" and doc["modes"] == {}
    cost = doc["prediction_cost_stage"]
    assert cost["window"] == 5 and cost["agents"] == 3 and cost["stride"] == 2
    for mode in ("incremental", "full"):
        assert set(cost[mode]) == {"2", "5", "past_window"}
        for summary in cost[mode].values():
            assert set(summary) == SUMMARY_KEYS and summary["p50_ms"] > 0.0
        # One frame per grid point of a predictor step, every agent predicted; past the
        # window, one restart cycle (stride steps) of them.
        assert cost[mode]["2"]["frames"] == cost[mode]["5"]["frames"] == 4
        assert cost[mode]["past_window"]["frames"] == 4 * 2
    assert cost["incremental_ratio_longest_to_shortest"] > 0.0
    assert cost["incremental_ratio_past_window_to_shortest"] > 0.0


def test_modes_and_node_cost_smoke(tmp_path: Path, cache_root: Path, kitti_bin: Path) -> None:
    """Every mode over DDS (the composed pipeline on the KITTI scan), and the node path's
    prediction cost, in a few frames each."""
    out = tmp_path / "e2e.json"
    args = ["bench", "e2e", "--setups", "composed", "--inputs", "kitti", "--sectors", "36"]
    frames = ["--frames", "2", "--warmup", "1", "--jit", "off"]
    small = ["--cost-lengths", "2", "3", "--cost-agents", "2", "--cost-repeats", "1"]
    common = ["--json", str(out), "--cache-dir", str(cache_root)]
    code = main([*args, *frames, *small, *common, "--prediction-cost", "node"])
    doc = json.loads(out.read_text())
    assert set(doc["modes"]) == {"baseline", "incremental", "speculation", "streaming"}
    # A loaded host may lose a frame to the node's deadlines: each is counted, and any loss
    # makes the exit status 1.
    lost = 0
    for mode, entry in doc["modes"].items():
        assert set(entry) == MODE_KEYS, mode
        assert entry["frames"] == 2 and 0 <= entry["lost"] <= entry["frames"]
        assert set(entry["runs"]) == {"composed/kitti"}
        lost += entry["lost"]
    runs = {mode: entry["runs"]["composed/kitti"] for mode, entry in doc["modes"].items()}
    assert runs["streaming"]["sectors_per_revolution"] > 1
    composed = {"perception_pipeline": LIDAR_STAGES | {"track", "predict"}}
    points = kitti_points(kitti_bin)
    for run in runs.values():
        if run["lost"] < run["frames"]:
            whole = run["sectors_per_revolution"] == 1
            check_per_hop(run["per_hop"], run["frames"], composed, whole, points)
    for mode in ("baseline", "incremental", "streaming"):
        assert runs[mode]["prediction_message"] == "speculation off", mode
    assert runs["baseline"]["node_status"]["perception_pipeline"]["prediction.mode"] == "full"
    assert "saved" in runs["speculation"]["prediction_message"]
    status = runs["speculation"]["node_status"]["perception_pipeline"]
    assert status["prediction.mode"] == "incremental" and status["prediction.speculation"] == "True"
    cost = doc["prediction_cost_node"]
    assert cost["stride"] == 1
    for mode in ("incremental", "full"):
        # Four frames timed at each length and past the window; a table lost on the way
        # (the nodes take their input best effort) is counted instead of timed.
        assert set(cost[mode]) == {"2", "3", "past_window"}
        assert all(set(v) == SUMMARY_KEYS and 1 <= v["frames"] <= 4 for v in cost[mode].values())
        missing = sum(4 - v["frames"] for v in cost[mode].values())
        assert missing == cost[f"{mode}_lost_timed"] <= cost[f"{mode}_lost"]
        assert cost[f"{mode}_ratio_past_window_to_shortest"] > 0.0
        lost += cost[f"{mode}_lost"]
    assert code == (1 if lost else 0)
    # Its own cost: wall time, and the peak RSS of the harness and of it with the nodes.
    assert doc["wall_s"] > 0.0
    assert 0.0 < doc["peak_harness_rss_mb"] < doc["peak_tree_rss_mb"]


def test_separate_per_hop(
    tmp_path: Path, cache_root: Path, kitti_bin: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The three nodes: scan to each topic, the hops between them, and each node's stages,
    in the JSON and the printed table."""
    out = tmp_path / "e2e.json"
    args = ["bench", "e2e", "--setups", "separate", "--inputs", "kitti", "--modes", "incremental"]
    frames = ["--frames", "3", "--warmup", "1", "--jit", "off", "--prediction-cost", "none"]
    # At a lidar's pace, not back to back.
    main([*args, *frames, "--rate-hz", "20", "--json", str(out), "--cache-dir", str(cache_root)])
    doc = json.loads(out.read_text())
    assert doc["figure"].endswith("scans at 20 Hz")
    run = doc["modes"]["incremental"]["runs"]["separate/kitti"]
    assert run["lost"] < run["frames"] == 3
    # With the JIT off no node compiles, nor starts a compile worker.
    assert run["jit"] == {"compiles": 0, "worker_starts": 0}
    assert all("jit.compiles_ok" in v for v in run["node_status"].values())
    stages = {
        "pointcloud_node": LIDAR_STAGES,
        "tracker_node": {"delivery", "convert", "track", "total"},
        "prediction_node": {"delivery", "convert", "predict", "total"},
    }
    check_per_hop(run["per_hop"], 3, stages, whole=True, points=kitti_points(kitti_bin))
    # The harness collected its garbage between frames, never inside a timed one.
    collections = run["harness_gc"]
    assert collections["in_frames"] == 0
    assert collections["between"] >= run["frames"]
    # Its CPU while a frame was in flight: the probe's and its middleware threads', per frame.
    waiting = run["harness_cpu_waiting"]
    assert set(waiting) == {"p50_ms", "p99_ms", "mean_ms", "max_ms"}
    assert 0.0 < waiting["p50_ms"] <= waiting["p99_ms"] <= waiting["max_ms"]
    printed = capsys.readouterr().out
    assert "harness: " in printed and "ms CPU a frame while waiting" in printed
    assert "incremental separate/kitti: scan to detected_objects" in printed
    assert "detected_objects->tracked_objects" in printed
    assert "pointcloud_node: delivery" in printed and "segment" in printed
    assert "tracker_node: delivery" in printed and "prediction_node: delivery" in printed


@pytest.mark.usefixtures("kitti_bin")
def test_rounds_alternate_the_setups_and_give_their_ratio(
    tmp_path: Path, cache_root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two rounds of both setups: each round's p50 and p99 per run, and the separate launch's
    p50 over the composed one's per round, in the JSON and the printed table."""
    out = tmp_path / "e2e.json"
    args = ["bench", "e2e", "--setups", "separate", "composed", "--inputs", "kitti"]
    frames = ["--modes", "incremental", "--frames", "2", "--warmup", "1", "--jit", "off"]
    common = ["--prediction-cost", "none", "--json", str(out), "--cache-dir", str(cache_root)]
    code = main([*args, *frames, *common, "--rounds", "2"])
    entry = json.loads(out.read_text())["modes"]["incremental"]
    assert set(entry) == MODE_KEYS | {"rounds", "separate_over_composed"}
    assert set(entry["runs"]) == {"separate/kitti", "composed/kitti"}
    assert len(entry["rounds"]) == 2
    for summary, name in zip(entry["rounds"][0].values(), entry["rounds"][0], strict=True):
        assert summary["p50_ms"] == entry["runs"][name]["p50_ms"]
    lost = 0
    for runs in entry["rounds"]:
        assert set(runs) == {"separate/kitti", "composed/kitti"}
        for run in runs.values():
            assert set(run) == {"p50_ms", "p99_ms", "frames", "lost", "compiles"}
            assert run["frames"] == 2 and run["compiles"] == 0
            lost += run["lost"]
    ratio = entry["separate_over_composed"]["kitti"]
    want = [r["separate/kitti"]["p50_ms"] / r["composed/kitti"]["p50_ms"] for r in entry["rounds"]]
    assert ratio["per_round"] == pytest.approx(want, abs=1e-3)
    assert min(want) - 1e-3 <= ratio["median"] <= max(want) + 1e-3
    assert code == (1 if lost else 0)
    printed = capsys.readouterr().out
    assert "incremental, p50 / p99 ms per round:" in printed
    assert "separate / composed p50, kitti:" in printed
    assert main([*args, *frames, *common, "--rounds", "0"]) == 2
    assert "--rounds must be at least 1" in capsys.readouterr().err
