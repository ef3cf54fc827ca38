"""``bench soak`` short run: both setups at 10 Hz, samples over time, the HTML plot, clean exits."""

from __future__ import annotations

import json
from pathlib import Path

import psutil
import pytest

from dynshape_perception.cli.main import main
from dynshape_perception.tools.bench.soak import summary

ROW_KEYS = {
    "t_s",
    "rss_mb",
    "processes",
    "threads",
    "fds",
    "harness_rss_mb",
    "sent",
    "answered",
    "misses",
    "p50_ms",
    "p99_ms",
    "max_ms",
}


def test_short_soak_of_both_setups(tmp_path: Path, cache_root: Path) -> None:
    out, page, image = tmp_path / "soak.json", tmp_path / "soak.html", tmp_path / "soak.png"
    args = ["bench", "soak", "--duration-s", "12", "--sample-s", "3", "--warmup-s", "3"]
    files = [
        "--json",
        str(out),
        "--html",
        str(page),
        "--png",
        str(image),
        "--cache-dir",
        str(cache_root),
    ]
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    assert main([*args, "--drive-frames", "20", *files]) == 0
    doc = json.loads(out.read_text())
    assert set(doc["setups"]) == {"composed", "separate"}
    for setup, processes in (("composed", 1), ("separate", 3)):
        entry = doc["setups"][setup]
        rows = entry["rows"]
        assert len(rows) >= 3 and all(set(r) == ROW_KEYS for r in rows)
        assert [r["t_s"] for r in rows] == sorted(r["t_s"] for r in rows)
        # The process tree of every node, counted: at least the nodes themselves.
        assert all(r["processes"] >= processes and r["rss_mb"] > 0 for r in rows)
        assert all(r["threads"] >= processes and r["fds"] > 0 for r in rows)
        s = entry["summary"]
        assert s["sent"] == sum(r["sent"] for r in rows) > 0
        assert s["answered"] > 0 and s["answered"] + s["misses"] <= s["sent"]
        assert set(entry["exit_codes"].values()) == {0}, entry["exit_codes"]
    html = page.read_text()
    assert "<img" in html and "data:image/png;base64," in html
    assert image.read_bytes().startswith(b"\x89PNG")
    left = {p.pid for p in psutil.Process().children(recursive=True)} - before
    assert not {p for p in left if psutil.pid_exists(p)}, "nodes outlived the soak"


def test_growth_is_measured_after_the_warm_up() -> None:
    rows = [
        {
            "t_s": t,
            "rss_mb": rss,
            "fds": 20,
            "threads": 9,
            "processes": 1,
            "p99_ms": p99,
            "sent": 10,
            "answered": 10,
            "misses": 0,
            "harness_rss_mb": 1.0,
        }
        for t, rss, p99 in ((0, 100.0, 50.0), (10, 200.0, 9.0), (20, 202.0, 8.0), (30, 204.0, 7.0))
    ]
    got = summary(rows, warmup_s=10)
    assert got["rss_mb"] == [200.0, 204.0] and got["rss_growth_pct"] == 2.0
    assert got["samples_after_warmup"] == 3 and got["sent"] == 40
    assert got["p99_ms_first_last_quarter"] == [9.0, 7.0]


@pytest.mark.parametrize(
    "bad",
    [["--duration-s", "0"], ["--rate-hz", "nan"], ["--warmup-s", "700"], ["--drive-frames", "0"]],
)
def test_bad_settings_exit_2(bad: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "soak", *bad]) == 2
    assert "error" in capsys.readouterr().err.lower()


def _saved_run(path: Path, setup: str, settings: dict[str, float] | None = None) -> Path:
    rows = [
        {
            "t_s": float(t),
            "rss_mb": 100.0 + t,
            "processes": 1,
            "threads": 9,
            "fds": 20,
            "harness_rss_mb": 1.0,
            "sent": 10,
            "answered": 10,
            "misses": 0,
            "p50_ms": 5.0,
            "p99_ms": 9.0,
            "max_ms": 12.0,
        }
        for t in (0, 10, 20)
    ]
    doc = {
        "benchmark": "soak",
        "machine": {"cpu_count": 2, "platform": "Linux"},
        "settings": settings or {"duration_s": 30.0, "warmup_s": 10.0},
        "setups": {setup: {"rows": rows, "summary": summary(rows, 10.0), "exit_codes": {"n": 0}}},
    }
    path.write_text(json.dumps(doc))
    return path


def test_runs_made_side_by_side_are_reported_together(tmp_path: Path) -> None:
    one = _saved_run(tmp_path / "one.json", "composed")
    two = _saved_run(tmp_path / "two.json", "separate")
    out, image = tmp_path / "both.json", tmp_path / "both.png"
    args = ["bench", "soak", "--from-json", str(one), str(two), "--json", str(out)]
    assert main([*args, "--png", str(image)]) == 0
    assert list(json.loads(out.read_text())["setups"]) == ["composed", "separate"]
    assert image.read_bytes().startswith(b"\x89PNG")


def test_runs_that_cannot_be_reported_together_exit_2(tmp_path: Path) -> None:
    one = _saved_run(tmp_path / "one.json", "composed")
    again = _saved_run(tmp_path / "again.json", "composed")
    other = _saved_run(tmp_path / "other.json", "separate", {"duration_s": 60.0})
    foreign = tmp_path / "foreign.json"
    foreign.write_text(json.dumps({"benchmark": "e2e"}))
    for pair in ((one, again), (one, other), (one, foreign), (one, tmp_path / "none.json")):
        assert main(["bench", "soak", "--from-json", *map(str, pair)]) == 2
