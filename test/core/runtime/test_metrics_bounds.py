"""Per-signature tables stay bounded however many distinct shapes a long drive brings."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from dynshape_perception.core.runtime import dispatcher as dispatcher_module
from dynshape_perception.core.runtime import metrics as metrics_module
from dynshape_perception.core.runtime.engine import Engine
from dynshape_perception.core.runtime.metrics import JitMetrics
from dynshape_perception.core.runtime.policy import JitConfig
from dynshape_perception.core.runtime.profile import dump_profile
from dynshape_perception.core.runtime.shapes import Signature, sample_inputs
from dynshape_perception.models import model_definition
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import init_weights


def test_latency_table_forgets_the_least_recently_called_signatures(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics_module, "MAX_LATENCY_SIGNATURES", 8)
    metrics = JitMetrics()
    hot = Signature.of("forward", {"P": 1})
    for p in range(2, 40):
        metrics.record_call("segmenter", hot, 1.0, hit=False, accepted=False)
        metrics.record_call("segmenter", Signature.of("forward", {"P": p}), 2.0, False, False)
    table = metrics.latency_table()["segmenter"]
    assert len(table) == 8
    assert table[str(hot)]["calls"] == 38, "a signature called all along is never dropped"
    assert metrics.snapshot()["latency_signatures_dropped"] == 39 - 8
    assert metrics.calls == 76


def test_profile_drops_signatures_seen_once_past_its_bound(
    monkeypatch: pytest.MonkeyPatch, cache_root: Path
) -> None:
    monkeypatch.setattr(dispatcher_module, "PROFILE_MAX", 16)
    model = model_definition("associator")
    weights = {"associator": init_weights(parameter_shapes(model), seed=8)}
    with Engine(
        "x86_64",
        JitConfig(mode="off"),
        cache_dir=cache_root,
        models=("associator",),
        weights=weights,
    ) as eng:
        d = eng["associator"]

        def call(n: int, m: int) -> None:
            d("forward", *sample_inputs(model, "forward", {"N": n, "M": m}, seed=n))

        for _ in range(3):
            call(5, 5)
        for n in range(1, 40):
            call(n, 7)
        counts = d.profile_counts()
        assert len(counts) <= 16
        assert counts[Signature.of("forward", {"N": 5, "M": 5})] == 3, "repeated shapes stay"
        assert d.profile_dropped > 0


def test_warm_up_counts_hotness_per_bucket_not_per_point_count(
    cache_root: Path, tmp_path: Path
) -> None:
    """A point count never repeats, but the bucket it falls in can be hot."""
    model = model_definition("associator")
    weights = {"associator": init_weights(parameter_shapes(model), seed=8)}
    edges = {"associator": {"N": (4, 16), "M": (4, 16)}}
    profile = tmp_path / "shapes.yaml"
    spread = Counter({Signature.of("forward", {"N": n, "M": 3}): 1 for n in range(5, 15)})
    dump_profile({"associator": spread}, profile)
    config = JitConfig(mode="frozen", compile_mode="thread", weak_edges=edges, accept_ratio=100.0)
    with Engine(
        "x86_64", config, cache_dir=cache_root, models=("associator",), weights=weights
    ) as eng:
        assert eng.warm_up(profile, wait_s=120) == 1
        assert eng["associator"].cache.keys() == [Signature.of("forward", {"M": 4, "N": 16})]
