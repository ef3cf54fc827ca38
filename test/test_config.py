"""models.yaml: every malformed section is a ConfigError naming it, never a silent change."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dynshape_perception import resources
from dynshape_perception.config import check_seed, default_config, load_models_config, read_yaml
from dynshape_perception.errors import ConfigError, WeightsError
from dynshape_perception.models import model_definition


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("roi:\n  x_m: [1]\n", r"roi x_m must be \[min, max\]"),
        ("roi: [1, 2]\n", "section 'roi' must be a mapping"),
        ("bounds: [1]\n", "section 'bounds' must be a mapping"),
        ("bounds: {P: 1.9}\n", "bound P must be an integer"),
        ("bounds: {P: true}\n", "bound P must be an integer"),
        ("bounds: {P: .inf}\n", "bound P must be an integer"),
        ("bounds: {P: 0}\n", "bound P must be a positive integer"),
        ("roi:\n  x_m: [0, .inf]\n", "roi x_m must be finite"),
        ("roi:\n  y_m: [5, -5]\n", "min < max"),
        ("roi:\n  z_m: [low, 3]\n", "could not convert"),
        ("bounds: {Q: 3}\n", "unexpected keyword"),
        ("- a list\n", "must hold a mapping"),
    ],
)
def test_malformed_models_yaml_is_a_config_error(tmp_path: Path, text: str, match: str) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=match):
        load_models_config(path)


def test_empty_sections_keep_the_defaults(tmp_path: Path) -> None:
    path = tmp_path / "models.yaml"
    path.write_text("bounds:\nroi:\n")
    config = load_models_config(path)
    assert config.bounds.P == 150_000 and config.roi.x_m == (0.0, 60.0)


def test_the_shipped_models_yaml_loads() -> None:
    assert default_config().bounds.as_dict() == {
        "P": 150_000,
        "N": 128,
        "M": 128,
        "A": 64,
        "T": 128,
    }


@pytest.mark.parametrize("seed", [-1, 1.5, True, "3"])
def test_seeds_must_be_non_negative_integers(seed: object) -> None:
    with pytest.raises(ConfigError, match="integer >= 0"):
        check_seed("seed", seed)


@pytest.mark.parametrize(
    ("section", "match"),
    [
        ("segmenter:\n  hidden: 64\n", "segmenter.hidden must be a list of 2 values, got 64"),
        ("segmenter:\n  hidden: [64, 128, 256]\n", "segmenter.hidden must be a list of 2 values"),
        ("segmenter:\n  hidden: [64, 2.5]\n", "segmenter.hidden must be an integer"),
        ("predictor:\n  K: six\n", "predictor.K must be an integer"),
        ("predictor:\n  K: 6.9\n", "predictor.K must be an integer"),
        ("predictor:\n  step_s: .nan\n", "step_s must be a finite number"),
        ("associator:\n  features: null\n", "associator.features must be an integer"),
    ],
)
def test_malformed_model_sections_are_config_errors(
    tmp_path: Path, section: str, match: str
) -> None:
    path = tmp_path / "models.yaml"
    path.write_text(section)
    config = load_models_config(path)
    name = section.split(":")[0]
    with pytest.raises(ConfigError, match=match):
        model_definition(name, config)


def test_an_installed_package_finds_its_share_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip puts data_files under <prefix>/share/<package>: no ROS environment needed."""
    share = tmp_path / "prefix" / "share" / "dynshape_perception"
    (share / "config").mkdir(parents=True)
    (share / "config" / "models.yaml").write_text("bounds: {}\n")
    site_packages = tmp_path / "prefix" / "lib" / "python3.11" / "site-packages"
    monkeypatch.setattr(resources, "__file__", str(site_packages / "dynshape_perception" / "r.py"))
    monkeypatch.setattr(sys, "prefix", str(tmp_path / "prefix"))
    monkeypatch.delenv("DYNSHAPE_PERCEPTION_SHARE", raising=False)
    resources.share_dir.cache_clear()
    try:
        assert resources.share_dir() == share
        assert resources.config_path("models.yaml").is_file()
    finally:
        resources.share_dir.cache_clear()


@pytest.mark.parametrize(
    ("content", "match"),
    [
        (None, "cannot read search space .*missing.yaml: .*No such file"),
        (b"\xff\xfe not utf-8", "cannot read search space .*: 'utf-8' codec"),
        (b"a: [1, 2\n", "cannot read search space .*: not valid YAML: while parsing"),
        (b"when: 2024-13-45\n", "cannot read search space .*: not valid YAML: month must be"),
    ],
)
def test_an_unreadable_yaml_file_is_an_error_of_the_callers_type(
    tmp_path: Path, content: bytes | None, match: str
) -> None:
    path = tmp_path / ("missing.yaml" if content is None else "space.yaml")
    if content is not None:
        path.write_bytes(content)
    with pytest.raises(ConfigError, match=match):
        read_yaml(path, "search space")


def test_a_caller_chooses_the_error_type_of_an_unreadable_yaml_file(tmp_path: Path) -> None:
    path = tmp_path / "manifest.yaml"
    path.write_text("models: [1, 2\n")
    with pytest.raises(WeightsError, match=r"cannot read weights manifest .*: not valid YAML"):
        read_yaml(path, "weights manifest", WeightsError)


def test_a_readable_yaml_file_gives_its_document(tmp_path: Path) -> None:
    path = tmp_path / "doc.yaml"
    path.write_text("a: [1, 2]\n")
    assert read_yaml(path, "document") == {"a": [1, 2]}
    path.write_text("")
    assert read_yaml(path, "document") is None
