"""Training-data plumbing of the fits: source lists, generated windows, provenance."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("torch", reason="fitting needs PyTorch (requirements-dev.txt)")

from dynshape_perception.errors import ConfigError, DataError
from dynshape_perception.tools.fit.data import (
    SyntheticPedestrians,
    parse_sources,
    synthetic_windows,
)
from dynshape_perception.tools.fit.runner import fit_command

ALLOWED = ("eth", "hotel", "synthetic")


def test_sources_are_normalised() -> None:
    assert parse_sources("Synthetic, hotel,hotel", ALLOWED) == ("hotel", "synthetic")
    assert fit_command("predictor", ("hotel", "synthetic"), 3) == (
        "dynshape-perception fit --model predictor --data hotel,synthetic --seed 3"
    )


@pytest.mark.parametrize("text", ["", "zara1", "eth,kitti", " , "])
def test_unknown_sources_are_refused(text: str) -> None:
    with pytest.raises(ConfigError, match="--data takes"):
        parse_sources(text, ALLOWED)


def test_synthetic_windows_are_seeded_and_shaped() -> None:
    spec = SyntheticPedestrians(scenes=2, agents=4, steps=22, idle_share=0.5)
    first, source = synthetic_windows(5, spec)
    again, _ = synthetic_windows(5, spec)
    other, _ = synthetic_windows(6, spec)
    walking = 2 * 4 * (22 - 20 + 1)
    assert first.shape == (2 * walking, 20, 2)
    np.testing.assert_array_equal(first, again)
    assert not np.array_equal(first, other)
    assert source.name == "synthetic" and "project's own" in source.licence
    assert f"{walking} walking windows" in source.detail
    assert f"{walking} idle ones" in source.detail


def test_synthetic_spec_is_checked() -> None:
    with pytest.raises(ConfigError, match="steps"):
        SyntheticPedestrians(steps=10)
    with pytest.raises(ConfigError, match="idle_share"):
        SyntheticPedestrians(idle_share=1.0)


def test_sources_without_any_window_are_a_data_error(tmp_path: Path) -> None:
    from dynshape_perception.tools.fit.predictor import PredictorFitConfig, training_windows

    (tmp_path / "eth_ucy").mkdir()
    (tmp_path / "eth_ucy" / "biwi_hotel.txt").write_text("")
    with pytest.raises(DataError, match="nothing to fit on"):
        training_windows(("hotel",), 0, PredictorFitConfig(), tmp_path)


@pytest.mark.parametrize("seed", [-1, 2**64])
def test_fit_seeds_are_checked_before_anything_runs(seed: int, tmp_path: Path) -> None:
    from dynshape_perception.tools.fit.runner import fit_and_save

    with pytest.raises(ConfigError, match="--seed must be an integer"):
        fit_and_save("associator", None, seed, tmp_path)
    assert not list(tmp_path.iterdir())
