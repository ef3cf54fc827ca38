"""Corpora, manifests, run folders and the bench's figures: no Ray needed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from dynshape_perception.cli.main import main
from dynshape_perception.errors import ConfigError
from dynshape_perception.tools.bench.fleet import measure
from dynshape_perception.tools.fleet.corpus import load_corpus, result_name
from dynshape_perception.tools.fleet.results import exit_status, summary_document
from dynshape_perception.tools.fleet.task import RESULT_FILE, read_outcome


def _bag(path: Path) -> Path:
    path.mkdir(parents=True)
    (path / "metadata.yaml").write_text("rosbag2_bagfile_information: {}\n")
    return path


def test_a_folder_corpus_finds_bags_at_any_depth_with_unique_names(tmp_path: Path) -> None:
    _bag(tmp_path / "c" / "city" / "day1")
    _bag(tmp_path / "c" / "hw" / "night" / "n1")
    _bag(tmp_path / "c" / "top")
    (tmp_path / "c" / "notes").mkdir()
    golden = tmp_path / "golden"
    (golden / "city__day1").mkdir(parents=True)
    entries = load_corpus(tmp_path / "c", golden)
    assert [e.name for e in entries] == ["city__day1", "hw__night__n1", "top"]
    assert entries[0].golden == golden / "city__day1" and entries[1].golden is None
    assert [e.name for e in load_corpus(tmp_path / "c" / "top")] == ["top"]
    assert result_name(Path("a b/c:d")) == "a_b__c_d"


def test_a_manifest_gives_paths_goldens_tags_and_names(tmp_path: Path) -> None:
    _bag(tmp_path / "bags" / "a")
    _bag(tmp_path / "bags" / "b")
    manifest = tmp_path / "m.yaml"
    manifest.write_text(
        "golden_root: g\nbags:\n  - bags/a\n"
        "  - {path: bags/b, golden: gb, tags: [night], name: bee}\n"
    )
    (tmp_path / "g" / "bags__a").mkdir(parents=True)
    a, b = load_corpus(manifest)
    assert (a.name, a.path, a.golden) == (
        "bags__a",
        tmp_path / "bags" / "a",
        tmp_path / "g" / "bags__a",
    )
    assert (b.name, b.golden, b.tags) == ("bee", tmp_path / "gb", ("night",))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("bags: []\n", "lists no bags"),
        ("- a\n", "needs a 'bags' list"),
        ("bags: [a]\nextra: 1\n", r"unknown keys \['extra'\]"),
        ("bags: [{golden: g}]\n", r"bags\[0\] needs a path"),
        ("bags: [{path: a, tags: 3}]\n", "tags must be a list of strings"),
        ("bags: [{path: a, name: x/y}]\n", "must be a plain folder name"),
        ("bags: [a, {path: b, name: a}]\n", "would share the result folder 'a'"),
        ("bags: [[a]]\n", "must be a path or a mapping"),
        ("bags: {a: 1\n", "cannot read corpus manifest"),
    ],
)
def test_bad_manifests_are_refused_with_the_reason(tmp_path: Path, text: str, message: str) -> None:
    manifest = tmp_path / "m.yaml"
    manifest.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_corpus(manifest)


def test_bad_corpora_and_arguments_exit_2_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "file.txt").write_text("x")
    cases = [
        (
            ["fleet", "replay", str(tmp_path / "none"), "--out", str(tmp_path / "r")],
            "does not exist",
        ),
        (
            ["fleet", "replay", str(tmp_path / "empty"), "--out", str(tmp_path / "r")],
            "no rosbag2 bag",
        ),
        (["fleet", "replay", str(tmp_path / "file.txt"), "--out", str(tmp_path / "r")], "neither"),
        (
            ["fleet", "replay", str(tmp_path / "empty"), "--out", str(tmp_path / "file.txt")],
            "exists and is not a folder",
        ),
        (
            ["fleet", "replay", str(tmp_path), "--out", str(tmp_path / "r"), "--workers", "0"],
            "--workers must be >= 1",
        ),
        (
            [
                *("fleet", "replay", str(tmp_path), "--out", str(tmp_path / "r")),
                *("--workers", "2", "--address", "auto"),
            ],
            "sizes the embedded Ray",
        ),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        assert message in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def _outcome(name: str, status: str, **extra: Any) -> dict[str, Any]:
    return {"name": name, "bag": f"/b/{name}", "status": status, "tags": [], **extra}


def test_the_exit_status_says_regression_before_failure() -> None:
    ok = _outcome("a", "ok", golden="pass")
    doc = summary_document("c", [ok, _outcome("b", "failed", reason="x")], {})
    assert exit_status(doc) == 3
    doc = summary_document("c", [ok, _outcome("b", "regressed", golden="fail")], {})
    assert exit_status(doc) == 1 and doc["totals"]["golden_failed"] == 1
    assert exit_status(summary_document("c", [ok, _outcome("e", "empty")], {})) == 0


def test_an_outcome_counts_only_when_whole(tmp_path: Path) -> None:
    folder = tmp_path / "bag"
    (folder / "output").mkdir(parents=True)
    assert read_outcome(folder) is None
    (folder / RESULT_FILE).write_text('{"name": "bag", "bag": "/b", "status": "ok"')
    assert read_outcome(folder) is None, "a cut-off file"
    (folder / RESULT_FILE).write_text('{"name": "bag", "bag": "/b", "status": "failed"}')
    assert read_outcome(folder) is None, "a failure is replayed again"
    (folder / RESULT_FILE).write_text('{"name": "bag", "bag": "/b", "status": "ok"}')
    outcome = read_outcome(folder)
    assert outcome is not None and outcome.status == "ok"


def test_the_bench_splits_each_bag_into_replay_and_engine_overhead() -> None:
    def done(pid: int, start: float) -> dict[str, Any]:
        timing = {
            "submitted_s": start,
            "started_s": start + 0.004,
            "finished_s": start + 2.0,
            "received_s": start + 2.006,
            "engine_s": 0.0001,
            "replay_s": 1.8,
        }
        worker = {"pid": pid, "peak_rss_mb": 500.0 + pid}
        return _outcome(f"b{start}", "ok", timing=timing, worker=worker)

    figures = measure([done(1, 0.0), done(2, 0.0), done(1, 2.0)], wall_s=4.0)
    assert figures["bags_per_min"] == 45.0
    assert figures["overhead_ms_p50"] == pytest.approx(10.1, abs=0.01)
    assert figures["overhead_share"] == pytest.approx(0.0101 / 1.8, abs=1e-4)
    assert figures["peak_rss_mb"] == {"1": 501.0, "2": 502.0}
    with pytest.raises(ConfigError, match="did not replay"):
        measure([_outcome("x", "failed", timing={}, worker={})], wall_s=1.0)
