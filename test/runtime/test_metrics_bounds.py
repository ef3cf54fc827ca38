"""The metrics object counts calls and lists the latency rows its dispatchers own."""

from __future__ import annotations

import threading

import pytest

from dynshape_perception.runtime import metrics as metrics_module
from dynshape_perception.runtime.metrics import (
    CallTally,
    CompileEvent,
    JitMetrics,
    LatencyStats,
)
from dynshape_perception.runtime.shapes import Signature


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


def test_one_models_recovery_does_not_hide_anothers_degrade() -> None:
    metrics = JitMetrics()
    metrics.set_degraded("segmenter", True)
    metrics.set_degraded("predictor", False)
    assert metrics.degraded and metrics.snapshot()["degraded"]
    metrics.set_degraded("segmenter", False)
    assert not metrics.degraded


def test_the_event_log_keeps_the_newest_and_readers_resume_where_they_left(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(metrics_module, "EVENTS_KEPT", 4)
    metrics = JitMetrics()

    def event(i: int) -> CompileEvent:
        return CompileEvent(float(i), "predictor", f"k{i}", True, 0.1)

    for i in range(3):
        metrics.record_compile(event(i))
    first, seen = metrics.events_since(0)
    assert [e.key for e in first] == ["k0", "k1", "k2"] and seen == 3
    for i in range(3, 9):
        metrics.record_compile(event(i))
    assert [e.key for e in metrics.events] == ["k5", "k6", "k7", "k8"], "bounded, newest kept"
    later, seen = metrics.events_since(seen)
    assert [e.key for e in later] == ["k5", "k6", "k7", "k8"], "k3 and k4 fell out unread"
    assert seen == 9 and metrics.events_since(seen) == ([], 9)
    assert metrics.compiles_ok == 9, "the counters count every event, kept or not"


def test_counters_and_events_are_read_in_one_step_while_compiles_land() -> None:
    """Each compile counts once in the counters and once in the events, however a reader's
    read interleaves with the threads that record them."""
    metrics = JitMetrics()
    per_thread = 600

    def record(thread: int) -> None:
        for i in range(per_thread):
            event = CompileEvent(float(i), "predictor", f"{thread}/{i}", i % 3 != 2, 0.001)
            metrics.record_compile(event, rejected=i % 3 == 1)
            if i % 50 == 0:
                metrics.record_event(CompileEvent(float(i), "predictor", "k", True, 0.0, "demoted"))

    writers = [threading.Thread(target=record, args=(t,)) for t in range(3)]
    for writer in writers:
        writer.start()
    reads = 0
    while any(w.is_alive() for w in writers) or reads == 0:
        counters, events = metrics.record()
        compiles = [e for e in events if not e.reason.startswith("demoted")]
        assert counters["compiles_ok"] == sum(e.ok and not e.rejected for e in compiles)
        assert counters["compiles_rejected"] == sum(e.rejected for e in compiles)
        assert counters["compiles_failed"] == sum(not e.ok for e in compiles)
        reads += 1
    for writer in writers:
        writer.join()
    counters, events = metrics.record()
    assert counters["compiles_ok"] + counters["compiles_rejected"] == 3 * 400
    assert counters["compiles_failed"] == 3 * 200
