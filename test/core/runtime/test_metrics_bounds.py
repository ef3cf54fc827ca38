"""The metrics' latency table stays bounded however many distinct shapes a long drive brings."""

from __future__ import annotations

import pytest

from dynshape_perception.core.runtime import metrics as metrics_module
from dynshape_perception.core.runtime.metrics import JitMetrics
from dynshape_perception.core.runtime.shapes import Signature


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
