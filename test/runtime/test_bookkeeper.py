"""Call records settled off the calling path: exact reads, bounded queues, a bookkeeper that
survives a failing settle."""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from dynshape_perception.models import model_definition
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import init_weights
from dynshape_perception.runtime import dispatcher as dispatcher_module
from dynshape_perception.runtime.bookkeeper import Bookkeeper
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.runtime.policy import JitConfig
from dynshape_perception.runtime.shapes import Signature, sample_inputs
from dynshape_perception.testing.faults import StalledBookkeeperFaultInjector

ASSOC = model_definition("associator")
WEIGHTS = {"associator": init_weights(parameter_shapes(ASSOC), seed=3)}


def frozen_engine(cache_root: Path, bookkeeper: Bookkeeper) -> Engine:
    # Frozen: no compile runs, so only the bookkeeping is under test.
    return Engine(
        "x86_64",
        JitConfig(mode="frozen", hotness_threshold=2),
        cache_dir=cache_root,
        models=("associator",),
        weights=WEIGHTS,
        bookkeeper=bookkeeper,
    )


def inputs(n: int, m: int, seed: int = 0) -> list[np.ndarray]:
    return sample_inputs(ASSOC, "forward", {"N": n, "M": m}, seed)


def test_calls_return_before_their_bookkeeping_and_every_read_sees_them(
    cache_root: Path,
) -> None:
    with frozen_engine(cache_root, Bookkeeper(poll_s=3600.0)) as eng:
        dispatcher = eng["associator"]
        for n in (1, 2, 2, 3, 3, 3):
            dispatcher("forward", *inputs(n, 2))
        assert len(dispatcher._inbox) == 6, "the calling thread only queues what it measured"
        assert eng.metrics.calls == 6
        assert not dispatcher._inbox
        dispatcher("forward", *inputs(3, 2))
        counts = dispatcher.shape_counts()
        assert counts[Signature.of("forward", {"N": 3, "M": 2})] == 4
        assert sum(counts.values()) == 7


def test_the_bookkeeper_settles_queued_calls_by_itself(cache_root: Path) -> None:
    with frozen_engine(cache_root, Bookkeeper(poll_s=0.005)) as eng:
        dispatcher = eng["associator"]
        for n in range(1, 9):
            dispatcher("forward", *inputs(n, 2))
        deadline = time.monotonic() + 10.0
        while dispatcher._inbox and time.monotonic() < deadline:
            time.sleep(0.005)
        assert not dispatcher._inbox
        assert dispatcher.tally.calls == 8, "settled by the bookkeeper, not by a read"


def test_a_stalled_bookkeeper_leaves_a_bounded_queue(
    cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(dispatcher_module, "RING_AT", 4)
    monkeypatch.setattr(dispatcher_module, "INBOX_MAX", 10)
    with frozen_engine(cache_root, StalledBookkeeperFaultInjector()) as eng:
        dispatcher = eng["associator"]
        dispatcher._settle_at = 4
        peak = 0
        for i in range(40):
            dispatcher("forward", *inputs(1 + i % 5, 2))
            peak = max(peak, len(dispatcher._inbox))
        assert peak <= 10, "past INBOX_MAX the caller settles its own calls"
        assert eng.metrics.calls == 40


def test_a_failing_settle_is_logged_and_the_bookkeeper_keeps_settling(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bookkeeper = Bookkeeper(poll_s=0.005)
    settled = threading.Event()
    failures = [0]

    def failing_settle_fault_injector() -> None:
        failures[0] += 1
        raise RuntimeError("injected")

    try:
        with caplog.at_level(logging.ERROR):
            bookkeeper.add(failing_settle_fault_injector)
            bookkeeper.add(settled.set)
            assert settled.wait(5.0), "a settler after a failing one still runs"
            deadline = time.monotonic() + 5.0
            while failures[0] < 2 and time.monotonic() < deadline:
                time.sleep(0.005)
        assert failures[0] >= 2 and bookkeeper.alive
        assert "settling call records failed" in caplog.text
    finally:
        bookkeeper.close()
    assert not bookkeeper.alive


def test_calls_after_close_are_still_counted(cache_root: Path) -> None:
    eng = frozen_engine(cache_root, Bookkeeper(poll_s=3600.0))
    dispatcher = eng["associator"]
    dispatcher("forward", *inputs(2, 2))
    eng.close()
    assert not dispatcher._inbox, "closing settles what was queued"
    for _ in range(3):
        dispatcher("forward", *inputs(2, 2))
    assert eng.metrics.calls == 4
