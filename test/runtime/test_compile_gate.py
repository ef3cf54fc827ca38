"""The compile gate: pools stopped while work is under way and for the hold after it."""

from __future__ import annotations

import threading
import time

from dynshape_perception.runtime.compile_gate import CompileGate
from dynshape_perception.scheduling.work import holding
from dynshape_perception.testing.clocks import FakeClock

HOLD_MS = 20.0
WAIT_S = 10.0


class RecordingPool:
    def __init__(self) -> None:
        self.calls: list[str] = []
        self.running = False

    def enter_yield(self) -> None:
        self.calls.append("stop")

    def leave_yield(self) -> None:
        self.calls.append("go")


def test_nested_work_stops_the_pools_once_and_they_run_after_the_hold() -> None:
    clock, pool = FakeClock(), RecordingPool()
    gate = CompileGate([pool], HOLD_MS, clock=clock, keeper=False)
    gate.enter()
    gate.enter()
    assert pool.calls == ["stop"] and gate.shut
    gate.leave()
    gate.leave()
    assert pool.calls == ["stop"], "within the hold"
    clock.advance_ms(HOLD_MS - 1)
    gate.poll()
    assert pool.calls == ["stop"]
    clock.advance_ms(2)
    gate.poll()
    assert pool.calls == ["stop", "go"] and not gate.shut
    assert gate.stops == 1


def test_work_within_the_hold_keeps_the_pools_stopped() -> None:
    clock, pool = FakeClock(), RecordingPool()
    gate = CompileGate([pool], HOLD_MS, clock=clock, keeper=False)
    for _ in range(5):
        with holding([gate]):
            clock.advance_ms(10)
        clock.advance_ms(HOLD_MS / 2)
        gate.poll()
    assert pool.calls == ["stop"], "frames closer than the hold: no resume between them"
    clock.advance_ms(HOLD_MS)
    gate.poll()
    assert pool.calls == ["stop", "go"]


def test_without_a_hold_the_pools_run_as_soon_as_work_ends() -> None:
    pool = RecordingPool()
    gate = CompileGate([pool], 0.0, keeper=False)
    with holding([gate]):
        assert pool.calls == ["stop"]
    assert pool.calls == ["stop", "go"]


def test_work_that_fails_lets_go_of_the_gate() -> None:
    pool = RecordingPool()
    gate = CompileGate([pool], 0.0, keeper=False)
    try:
        with holding([gate]):
            raise RuntimeError("injected stage failure")
    except RuntimeError:
        pass
    assert pool.calls == ["stop", "go"]


def test_the_keeper_resumes_the_pools_after_the_hold() -> None:
    pool = RecordingPool()
    gate = CompileGate([pool], HOLD_MS)
    try:
        with holding([gate]):
            pass
        deadline = time.monotonic() + WAIT_S
        while pool.calls != ["stop", "go"] and time.monotonic() < deadline:
            time.sleep(0.005)
        assert pool.calls == ["stop", "go"]
    finally:
        gate.close()


def test_closing_resumes_what_the_gate_holds_and_holds_nothing_after() -> None:
    pool = RecordingPool()
    gate = CompileGate([pool], 60_000.0)
    gate.enter()
    closer = threading.Thread(target=gate.close)
    closer.start()
    closer.join(WAIT_S)
    assert not closer.is_alive() and pool.calls == ["stop", "go"]
    gate.leave()
    with holding([gate]):
        pass
    assert pool.calls == ["stop", "go"]


def test_a_gate_without_pools_holds_nothing() -> None:
    gate = CompileGate([], HOLD_MS)
    with holding([gate]):
        assert not gate.shut
    gate.close()
