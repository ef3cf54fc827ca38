"""Padding and packing encode histories identically; the measured rule picks the faster."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from dynshape_perception.compiler.cache import ArtefactCache
from dynshape_perception.compiler.targets import load_profile
from dynshape_perception.errors import ConfigError, InputValueError, ShapeError
from dynshape_perception.models import model_definition
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import init_weights
from dynshape_perception.perception.prediction.batching import HistoryBatcher
from dynshape_perception.runtime.executable import LoadedModel


def histories(seed: int, count: int, longest: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [
        np.cumsum(rng.normal(0, 0.4, size=(int(n), 2)), axis=0).astype(np.float32)
        for n in rng.integers(1, longest + 1, size=count)
    ]


def test_layouts_agree_and_the_choice_follows_measurements(cache_root: Path) -> None:
    model = model_definition("predictor")
    weights = init_weights(parameter_shapes(model), seed=2)
    artefact = ArtefactCache(cache_root).get_or_build(model, weights, load_profile("x86_64"))
    runner = LoadedModel(model, artefact.library_path)
    batcher = HistoryBatcher(runner, calibration=2)
    hist = histories(1, 20, 60)
    first = batcher.encode(hist)
    second = batcher.encode(hist)
    for a, b in zip(first, second, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)
    stats = next(iter(batcher.stats.values()))
    assert {k: len(v) for k, v in stats.samples.items()} == {"pad": 1, "pack": 1}
    for _ in range(2):
        batcher.encode(hist)
    # The latest ``calibration`` timings decide.
    stats.samples["pack"].extend([9.0, 9.0])
    stats.samples["pad"].extend([1.0, 1.0])
    assert batcher.layout_for(np.asarray([len(h) for h in hist])) == "pad"
    stats.samples["pad"].extend([20.0, 20.0])
    assert batcher.layout_for(np.asarray([len(h) for h in hist])) == "pack"
    assert batcher.encode([])[0].shape == (0, model.config.hidden)


def test_timings_stay_bounded_and_recalibration_alternates(cache_root: Path) -> None:
    model = model_definition("predictor")
    weights = init_weights(parameter_shapes(model), seed=2)
    artefact = ArtefactCache(cache_root).get_or_build(model, weights, load_profile("x86_64"))
    batcher = HistoryBatcher(LoadedModel(model, artefact.library_path), 2, recalibrate_every=5)
    hist = histories(1, 4, 12)
    for _ in range(60):
        batcher.encode(hist)
    stats = next(iter(batcher.stats.values()))
    assert all(len(v) == 2 for v in stats.samples.values())
    # Every fifth call re-times the layout timed least, so both keep being measured.
    assert min(stats.timed.values()) >= 2 + (60 // 5 - 2) // 2


def always(layout: str) -> Callable[[np.ndarray], str]:
    """A layout choice that is ``layout`` whatever the lengths."""
    return lambda lengths: layout


def test_bad_histories_and_settings_are_package_errors(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model = model_definition("predictor")
    weights = init_weights(parameter_shapes(model), seed=2)
    artefact = ArtefactCache(cache_root).get_or_build(model, weights, load_profile("x86_64"))
    batcher = HistoryBatcher(LoadedModel(model, artefact.library_path))
    with pytest.raises(InputValueError, match="at least one sample"):
        batcher.encode([np.zeros((3, 2), np.float32), np.zeros((0, 2), np.float32)])
    # Either layout: padding would broadcast a 1-D history into rows of one sample.
    for layout in ("pad", "pack"):
        monkeypatch.setattr(batcher, "layout_for", always(layout))
        for bad in (
            [np.asarray([0.5, 1.5], np.float32), np.zeros((3, 2), np.float32)],
            [np.zeros((2, 3), np.float32), np.zeros((3, 3), np.float32)],
            [np.zeros((2, 2, 1), np.float32)],
        ):
            with pytest.raises(ShapeError, match=r"\[n, 2\]"):
                batcher.encode(bad)
    with pytest.raises(ConfigError, match="recalibrate_every"):
        HistoryBatcher(batcher._predictor, recalibrate_every=0)
    with pytest.raises(ConfigError, match="calibration"):
        HistoryBatcher(batcher._predictor, calibration=0)


def test_batches_of_other_sizes_are_timed_apart() -> None:
    """Same agent count and waste, 20x the samples: one layout's timing is no guide to the
    other size."""
    short, long = np.asarray([2, 2, 1]), np.asarray([40, 40, 20])
    a_short, waste_short, _ = HistoryBatcher.shape_class(short)
    a_long, waste_long, _ = HistoryBatcher.shape_class(long)
    assert (a_short, waste_short) == (a_long, waste_long)
    assert HistoryBatcher.shape_class(short) != HistoryBatcher.shape_class(long)
