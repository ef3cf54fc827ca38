"""Every verb on every kind of bad input file: exit 2, one error line naming it, no traceback."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest

from dynshape_perception.cli import replay as replay_cli
from dynshape_perception.cli import tune as tune_cli
from dynshape_perception.cli.main import main
from dynshape_perception.tools.replay import sources
from dynshape_perception.tools.sim.drive import DriveConfig

KINDS = ("missing", "empty", "folder", "binary", "broken-yaml", "three-columns")
SPACE = "parameters:\n  tracking.gate_distance_m: {low: 0.2, high: 4.0}\n"


def _bad_file(folder: Path, kind: str) -> Path:
    path = folder / f"bad-{kind}"
    if kind == "empty":
        path.write_bytes(b"")
    elif kind == "folder":
        path.mkdir()
    elif kind == "binary":
        path.write_bytes(bytes(range(256)) * 3 + b"\x00")
    elif kind == "broken-yaml":
        path.write_text("{{{: [\n  - 1\n")
    elif kind == "three-columns":
        path.write_text("0 1 2.5\n10 1 3.0\n20 1 3.5\n")
    return path


@pytest.fixture(scope="module")
def good_bag(tmp_path_factory: pytest.TempPathFactory) -> Path:
    bag = tmp_path_factory.mktemp("bags") / "drive"
    sources.write_generated(bag, "mcap", DriveConfig(seed=1, frames=2, points_range=(500, 600)))
    return bag


def _no_engine_fault_injector(*_: object) -> None:
    raise AssertionError("bad input must be refused before the engine is built")


Argv = Callable[[Path, Path, Path], list[str]]
# verb -> the command line with the bad file in one input slot (bad, a good bag, scratch).
VERBS: dict[str, Argv] = {
    "evaluate prediction --eth-ucy": lambda bad, bag, tmp: [
        *("evaluate", "prediction", "--eth-ucy", str(bad)),
    ],
    "evaluate segmentation --kitti-bin": lambda bad, bag, tmp: [
        *("evaluate", "segmentation", "--kitti-bin", str(bad)),
    ],
    "make-bag kitti --input": lambda bad, bag, tmp: [
        *("make-bag", "--source", "kitti", "--input", str(bad), "--out", str(tmp / "k")),
    ],
    "make-bag eth_ucy --input": lambda bad, bag, tmp: [
        *("make-bag", "--source", "eth_ucy", "--input", str(bad), "--out", str(tmp / "e")),
    ],
    "replay BAG": lambda bad, bag, tmp: ["replay", str(bad)],
    "replay --mode dds BAG": lambda bad, bag, tmp: ["replay", "--mode", "dds", str(bad)],
    "replay --config": lambda bad, bag, tmp: ["replay", str(bag), "--config", str(bad)],
    "replay --jit-shapes": lambda bad, bag, tmp: [
        *("replay", str(bag), "--jit", "frozen", "--jit-shapes", str(bad)),
    ],
    "replay --check": lambda bad, bag, tmp: ["replay", str(bag), "--check", str(bad)],
    "report RUN_DIR": lambda bad, bag, tmp: ["report", str(bad)],
    "tune --space": lambda bad, bag, tmp: ["tune", "--space", str(bad), "--bags", str(bag)],
    "tune --bags": lambda bad, bag, tmp: [
        *("tune", "--space", str(_space(tmp)), "--bags", str(bag), str(bad)),
    ],
    "bench e2e --scan": lambda bad, bag, tmp: ["bench", "e2e", "--scan", str(bad)],
}


def _space(tmp: Path) -> Path:
    space = tmp / "space.yaml"
    space.write_text(SPACE)
    return space


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("verb", sorted(VERBS))
def test_a_bad_input_file_is_one_error_line_naming_it(
    verb: str,
    kind: str,
    good_bag: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setattr(replay_cli, "build_engine", _no_engine_fault_injector)
    monkeypatch.setattr(tune_cli, "build_engine", _no_engine_fault_injector)
    bad = _bad_file(tmp_path, kind)
    assert main(VERBS[verb](bad, good_bag, tmp_path)) == 2
    captured = capsys.readouterr()
    err = captured.err
    assert err.startswith("error: ") and err.count("\n") == 1, err
    assert str(bad) in err
    assert "Traceback" not in err + captured.out


@pytest.mark.parametrize("kind", ["empty", "binary"])
def test_the_cache_verb_refuses_a_file_for_its_folder(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = _bad_file(tmp_path, kind)
    assert main(["cache", "--cache-dir", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1 and str(bad) in err


def test_bench_e2e_checks_its_params_file_before_starting_nodes(
    kitti_bin: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    for kind in KINDS:
        bad = _bad_file(tmp_path, kind)
        assert main(["bench", "e2e", "--scan", str(kitti_bin), "--params-file", str(bad)]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1 and str(bad) in err, err
