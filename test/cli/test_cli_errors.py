"""Bad command lines end in one ``error: ...`` line and exit 2, before any slow work."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from dynshape_perception.cli import report as report_cli
from dynshape_perception.cli.main import main
from dynshape_perception.compiler.targets import load_profile
from dynshape_perception.errors import ConfigError
from dynshape_perception.tools.replay.metrics import FrameRecord, RunMetrics
from dynshape_perception.tools.replay.params import DEFAULT_DEADLINES_MS


def _error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert "Traceback" not in err
    return err


@pytest.fixture
def afile(tmp_path: Path) -> Path:
    path = tmp_path / "afile"
    path.write_text("not a folder\n")
    return path


def test_an_oserror_is_one_error_line_and_traceback_only_with_verbose(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    caplog: pytest.LogCaptureFixture,
) -> None:
    def full_disk_fault_injector(*_: object) -> Path:
        raise OSError(28, "No space left on device\n(while writing)")

    monkeypatch.setattr(report_cli, "write_report", full_disk_fault_injector)
    err = _error(capsys, ["report", str(tmp_path)])
    assert "No space left on device (while writing)" in err
    with caplog.at_level(logging.INFO):
        _error(capsys, ["-v", "report", str(tmp_path)])
    assert any(r.exc_info is not None for r in caplog.records)


def test_a_broken_pipe_still_exits_quietly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def closed_reader_fault_injector(*_: object) -> Path:
        raise BrokenPipeError(32, "Broken pipe")

    monkeypatch.setattr(report_cli, "write_report", closed_reader_fault_injector)
    monkeypatch.setattr("sys.stderr", open(tmp_path / "stderr", "w"))
    assert main(["report", str(tmp_path)]) == 0


def test_compile_refuses_unusable_paths_and_long_target_names(
    afile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = ["compile", "--model", "segmenter"]
    assert "--out" in _error(capsys, [*out, "--out", str(afile)])
    assert "--cache-dir" in _error(
        capsys, [*out, "--out", str(tmp_path / "o"), "--cache-dir", str(afile)]
    )
    err = _error(capsys, [*out, "--out", str(tmp_path / "o"), "--target", "x" * 300])
    assert "unknown target profile" in err and "x86_64" in err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("name", ["x" * 300, "../targets/x86_64", "", "x86_64/"])
def test_unknown_profile_names_never_reach_the_filesystem(name: str) -> None:
    with pytest.raises(ConfigError, match="unknown target profile"):
        load_profile(name)


def test_bundle_refuses_bad_arguments_before_writing(
    afile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "bundle"
    base = ["bundle", "--target", "x86_64"]
    assert "not a folder" in _error(capsys, [*base, "--out", str(afile)])
    assert "X.Y" in _error(capsys, [*base, "--out", str(out), "--python", "abc"])
    assert "X.Y" in _error(capsys, [*base, "--out", str(out), "--python", "3.x"])
    for limit in ("nan", "inf", "-1", "0"):
        assert "finite number of MB > 0" in _error(
            capsys, [*base, "--out", str(out), "--max-mb", limit]
        )
    assert "is a folder" in _error(capsys, [*base, "--out", str(out), "--json", str(tmp_path)])
    assert not out.exists()


def test_verify_checks_its_output_paths_first(
    afile: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    base = ["verify", "--target", "aarch64"]
    assert "is a folder" in _error(capsys, [*base, "--json", str(tmp_path)])
    assert "not a folder" in _error(capsys, [*base, "--json", str(afile / "x" / "r.json")])
    assert "--work-dir" in _error(capsys, [*base, "--work-dir", str(afile)])
    assert "--cache-dir" in _error(capsys, [*base, "--cache-dir", str(afile)])


def _run_dir(path: Path, doc: object) -> Path:
    path.mkdir()
    (path / "metrics.json").write_text(json.dumps(doc))
    return path


def _metrics() -> dict[str, object]:
    metrics = RunMetrics(DEFAULT_DEADLINES_MS, {"bag": "x", "mode": "inprocess", "jit": "off"})
    for i in range(3):
        latency = {"segment": 1.0, "cluster": 2.0, "track": 1.0, "predict": 3.0, "total": 7.0}
        counts = {"points": 10, "obstacles": 1}
        metrics.add_frame(FrameRecord(i, i, 0.1 * i, 0.1 * i, latency_ms=latency, counts=counts))
    return metrics.document()


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ({"frames": []}, "no summary"),
        ({"frames": 5, "summary": 3}, "frames is 5"),
        ({**_metrics(), "summary": {**_metrics()["summary"], "drops": {"1": "x"}}}, "drops"),  # type: ignore[dict-item]
        ({**_metrics(), "frames": [{"t_s": 0.0}]}, r"frames\[0\]"),
        ({**_metrics(), "tiers": {"1": {"stages": "segment"}}}, "tiers.1.stages"),
    ],
)
def test_report_refuses_malformed_metrics(
    tmp_path: Path, doc: object, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    run = _run_dir(tmp_path / "run", doc)
    assert message.replace("\\", "") in _error(capsys, ["report", str(run)]).replace("\\", "")
    assert not (run / "report.html").exists()


def test_report_output_paths(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = _run_dir(tmp_path / "run", _metrics())
    assert "is a folder" in _error(capsys, ["report", str(run), "--out", str(tmp_path)])
    afile = tmp_path / "afile"
    afile.write_text("")
    assert "not a folder" in _error(capsys, ["report", str(run), "--out", str(afile / "r.html")])
    out = tmp_path / "new" / "dir" / "r.html"
    assert main(["report", str(run), "--out", str(out)]) == 0
    assert out.read_text().startswith("<!DOCTYPE html>")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--frames", "-3"], "--frames must be >= 1"),
        (["--frames", "0"], "--frames must be >= 1"),
        (["--seed", "-1"], "--seed must be an integer >= 0"),
        (["--seed", str(2**63)], "--seed must be an integer >= 0"),
        (["--frame-timeout-s", "nan"], "--frame-timeout-s must be a finite number > 0"),
        (["--startup-timeout-s", "0"], "--startup-timeout-s must be a finite number > 0"),
    ],
)
def test_demo_refuses_arguments_that_run_nothing(
    args: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert message in _error(capsys, ["demo", "--in-process", "--jit", "off", *args])


def test_evaluate_refuses_bad_seeds_and_plot_formats(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = str(tmp_path / "missing.txt")
    err = _error(capsys, ["evaluate", "prediction", "--eth-ucy", missing, "--seed", "-1"])
    assert "--seed must be an integer >= 0" in err
    args = ["evaluate", "segmentation", "--kitti-bin", missing, "--plot", str(tmp_path / "x.xyz")]
    assert "suffix must be one of" in _error(capsys, args)
