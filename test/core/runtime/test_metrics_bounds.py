"""The metrics object counts calls and lists the latency rows its dispatchers own."""

from __future__ import annotations

import pytest

from dynshape_perception.core.runtime.metrics import CallTally, JitMetrics, LatencyStats
from dynshape_perception.core.runtime.shapes import Signature


def test_latency_rows_come_from_their_owners_and_uncalled_rows_are_left_out() -> None:
    metrics = JitMetrics()
    hot, cold = Signature.of("forward", {"P": 1}), Signature.of("forward", {"P": 2})
    rows = {hot: LatencyStats(), cold: LatencyStats()}
    tally = CallTally()
    metrics.add_source("segmenter", lambda: list(rows.items()), tally)
    for ms in (1.0, 3.0):
        tally.add(rows[hot], ms, hit=False, accepted=False)
    tally.add(rows[hot], 2.0, hit=True, accepted=True)
    table = metrics.latency_table()
    assert list(table) == ["segmenter"]
    assert table["segmenter"] == {
        # The running mean of 1, 3, 2 ms at weight 0.2: 1.0, 1.4, 1.52.
        str(hot): {"calls": 3, "mean_ms": 1.52, "max_ms": 3.0}
    }, "a row never called is not listed"
    snap = metrics.snapshot()
    assert (snap["calls"], snap["hits"], snap["generic_calls"], snap["misses"]) == (3, 1, 2, 0)
    other = CallTally()
    metrics.add_source("predictor", list, other)
    other.add(LatencyStats(), 4.0, hit=False, accepted=True)
    assert (metrics.calls, metrics.misses, metrics.hit_rate) == (4, 1, 0.5), "tallies are summed"
    assert metrics.busy_s == pytest.approx(0.010)
