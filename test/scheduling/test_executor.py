"""Executors: ordering, shedding, counting and shutdown, driven by a fake clock or by events."""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Generator
from concurrent.futures import CancelledError
from typing import Any

import pytest

from dynshape_perception.errors import ConfigError, SchedulingError
from dynshape_perception.scheduling.executor import (
    Arrival,
    ExecutorOptions,
    FifoExecutor,
    TieredExecutor,
    diagnostic_status,
)
from dynshape_perception.scheduling.tiers import Tier, TierConfig
from dynshape_perception.scheduling.work import Window
from dynshape_perception.testing.clocks import FakeClock

WAIT_S = 10.0


class RecordingPool:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def pause(self) -> None:
        self.calls.append("pause")

    def resume(self) -> None:
        self.calls.append("resume")


class RecordingGate:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def enter(self) -> None:
        self.calls.append("enter")

    def leave(self) -> None:
        self.calls.append("leave")


def slow_stage_fault_injector(
    clock: FakeClock, ms: float, log: list[str], tag: str
) -> Callable[[], str]:
    """A stage that takes ``ms`` of (fake) time."""

    def stage() -> str:
        clock.advance_ms(ms)
        log.append(tag)
        return tag

    return stage


def returning(value: int) -> Callable[[], int]:
    """A stage that returns ``value``."""
    return lambda: value


class BlockingStageFaultInjector:
    """Fault injector: a stage that, once started, holds its lane until released."""

    def __init__(self, result: str) -> None:
        self.result = result
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self) -> str:
        self.started.set()
        self.release.wait(WAIT_S)
        return self.result


def tiered(clock: FakeClock, **changes: Any) -> TieredExecutor:
    return TieredExecutor(TierConfig().with_changes(changes), clock=clock, start=False)


def drops(ex: TieredExecutor | FifoExecutor, tier: str) -> dict[str, int]:
    return ex.snapshot()["tiers"][tier]["dropped_by"]


def test_strict_priority_across_tiers_and_edf_within_one() -> None:
    clock = FakeClock()
    log: list[str] = []
    ex = tiered(clock)
    early = ex.arrive("other")
    clock.advance_ms(1)
    ex.submit(slow_stage_fault_injector(clock, 1, log, "t3"), 3)
    ex.submit(slow_stage_fault_injector(clock, 1, log, "t2-late"), 2)
    ex.submit(slow_stage_fault_injector(clock, 1, log, "t4"), 4)
    ex.submit(slow_stage_fault_injector(clock, 1, log, "t2-early"), 2, arrival=early)
    ex.submit(slow_stage_fault_injector(clock, 1, log, "t1"), 1)
    while ex.run_one():
        pass
    assert log == ["t1", "t2-early", "t2-late", "t3", "t4"]


def test_reserved_lane_serves_tier_one_only() -> None:
    clock = FakeClock()
    log: list[str] = []
    ex = tiered(clock)
    ex.submit(slow_stage_fault_injector(clock, 1, log, "t2"), 2)
    assert not ex.run_one("reserved")
    ex.submit(slow_stage_fault_injector(clock, 1, log, "t1"), 1)
    assert ex.run_one("reserved")
    assert log == ["t1"]
    assert ex.run_one("shared") and log == ["t1", "t2"]


def test_newest_frame_wins_per_stream_and_stale_frames_are_counted() -> None:
    clock = FakeClock()
    log: list[str] = []
    ex = tiered(clock)
    old = ex.submit(
        slow_stage_fault_injector(clock, 1, log, "old"), 2, arrival=ex.arrive("points"), name="seg"
    )
    other = ex.submit(
        slow_stage_fault_injector(clock, 1, log, "near"),
        1,
        arrival=ex.arrive("points"),
        name="near",
    )
    new = ex.submit(
        slow_stage_fault_injector(clock, 1, log, "new"), 2, arrival=ex.arrive("points"), name="seg"
    )
    with pytest.raises(CancelledError, match="seg dropped: stale"):
        old.result(timeout=0)
    while ex.run_one():
        pass
    assert log == ["near", "new"]
    assert new.result(timeout=0) == "new" and other.result(timeout=0) == "near"
    assert drops(ex, "2")["stale"] == 1
    snap = ex.snapshot()["tiers"]["2"]
    assert (snap["submitted"], snap["completed"], snap["dropped"]) == (2, 1, 1)


class Scan:
    """What a unit holds on to: a frame's data, weakly referable."""


def holding(scan: Scan) -> Callable[[], Scan]:
    """A stage whose closure holds ``scan``, as a node's holds its frame."""
    return lambda: scan


def test_replaced_units_are_let_go_while_their_tier_waits() -> None:
    """A tier that does not run for a while keeps no more than a few of the frames that
    newer ones replaced, so neither their data nor the queue's walks grow with the wait."""
    clock = FakeClock()
    ex = tiered(clock)
    scans: list[weakref.ref[Scan]] = []
    futures = []
    for _ in range(1000):
        scan = Scan()
        scans.append(weakref.ref(scan))
        futures.append(ex.submit(holding(scan), 4, arrival=ex.arrive("markers"), name="markers"))
        del scan
    planning = ex.submit(returning(2), 2, arrival=ex.arrive("points"), name="seg")
    held = sum(ref() is not None for ref in scans)
    assert 1 <= held <= 40
    assert drops(ex, "4")["stale"] == 999
    assert ex.snapshot()["tiers"]["4"]["queued"] == 1
    assert ex.run_one() and ex.run_one() and not ex.run_one()
    assert planning.result(timeout=0) == 2
    assert futures[-1].result(timeout=0) is scans[-1]()


def test_queue_depth_is_enforced_for_lower_tiers_only() -> None:
    clock = FakeClock()
    log: list[str] = []
    ex = tiered(clock, max_queue_depth=2)
    for k in range(3):
        ex.submit(slow_stage_fault_injector(clock, 1, log, f"q{k}"), 3)
    assert drops(ex, "3")["admission"] == 1
    for k in range(5):
        ex.submit(slow_stage_fault_injector(clock, 1, log, f"c{k}"), 1)
    assert drops(ex, "1")["admission"] == 0


def test_work_longer_than_its_whole_budget_still_runs_and_misses() -> None:
    """Shedding it for time would lock it out for good: its estimate could never improve."""
    clock = FakeClock()
    log: list[str] = []
    ex = tiered(clock)
    ex.set_estimate("plan", 150.0)
    future = ex.submit(slow_stage_fault_injector(clock, 120, log, "late"), 2, name="plan")
    clock.advance_ms(5)
    assert ex.run_one()
    assert future.result(timeout=0) == "late"
    tier2 = ex.snapshot()["tiers"]["2"]
    assert (tier2["completed"], tier2["misses"], tier2["dropped"]) == (1, 1, 0)
    assert ex.estimate_ms("plan") == pytest.approx(150.0 + 0.2 * (120.0 - 150.0))


def test_costs_are_estimated_per_input_size() -> None:
    """A large scan's cost must not be judged by a small one's: estimates per size bucket."""
    clock = FakeClock()
    log: list[str] = []
    ex = tiered(clock)
    for size, ms in ((1000, 4.0), (120_000, 60.0)):
        ex.submit(slow_stage_fault_injector(clock, ms, log, "cloud"), 2, name="cloud", size=size)
        assert ex.run_one()
    assert ex.estimate_ms("cloud", 1000) == pytest.approx(4.0)
    assert ex.estimate_ms("cloud", 900) == pytest.approx(4.0)
    assert ex.estimate_ms("cloud", 120_000) == pytest.approx(60.0)
    # A size never seen yet falls back to the name's estimate over every size.
    assert ex.estimate_ms("cloud", 10) == pytest.approx(4.0 + 0.2 * (60.0 - 4.0))
    # After 50 ms of backlog, a small scan still fits its 100 ms and a large one does not.
    ex.submit(slow_stage_fault_injector(clock, 50, log, "busy"), 2, est_ms=50.0)
    ex.submit(slow_stage_fault_injector(clock, 4, log, "small"), 3, name="cloud", size=1000)
    ex.submit(slow_stage_fault_injector(clock, 60, log, "big"), 2, name="cloud", size=120_000)
    assert drops(ex, "2")["admission"] == 1 and drops(ex, "3")["admission"] == 0
    ex.set_estimate("cloud", 1.0, size=64)
    assert ex.estimate_ms("cloud", 50) == pytest.approx(1.0)
    with pytest.raises(ConfigError, match="size must be an integer >= 0"):
        ex.submit(lambda: None, 2, name="cloud", size=-1)


def test_backlog_ahead_makes_later_work_infeasible() -> None:
    clock = FakeClock()
    log: list[str] = []
    ex = tiered(clock)
    ex.submit(slow_stage_fault_injector(clock, 60, log, "a"), 2, est_ms=60.0)
    ex.submit(slow_stage_fault_injector(clock, 60, log, "b"), 2, est_ms=60.0)
    assert drops(ex, "2")["admission"] == 1
    # Lower-priority work queued behind does not count against tier 2.
    ex2 = tiered(clock)
    ex2.submit(slow_stage_fault_injector(clock, 60, log, "c"), 3, est_ms=900.0)
    ex2.submit(slow_stage_fault_injector(clock, 60, log, "d"), 2, est_ms=60.0)
    assert drops(ex2, "2")["admission"] == 0


def test_work_that_can_no_longer_meet_its_deadline_is_shed_at_dispatch() -> None:
    clock = FakeClock()
    log: list[str] = []
    ex = tiered(clock)
    late = ex.submit(slow_stage_fault_injector(clock, 1, log, "late"), 2)
    clock.advance_ms(101)
    assert not ex.run_one()
    assert log == [] and drops(ex, "2")["expired"] == 1
    with pytest.raises(CancelledError, match="expired"):
        late.result(timeout=0)


def test_tier_one_runs_late_and_the_miss_is_counted() -> None:
    clock = FakeClock()
    log: list[str] = []
    ex = tiered(clock)
    ex.submit(slow_stage_fault_injector(clock, 25, log, "slow"), 1)
    ex.submit(slow_stage_fault_injector(clock, 4, log, "fast"), 1)
    while ex.run_one("reserved"):
        pass
    tier1 = ex.snapshot()["tiers"]["1"]
    assert (tier1["completed"], tier1["misses"], tier1["dropped"]) == (2, 2, 0)
    assert tier1["max_ms"] == pytest.approx(29.0)


def test_chunked_work_yields_to_higher_tiers_between_chunks() -> None:
    clock = FakeClock()
    log: list[str] = []
    ex = tiered(clock)

    def comfort() -> Generator[None, None, str]:
        for k in range(3):
            clock.advance_ms(2)
            log.append(f"chunk{k}")
            yield
        return "comfort-done"

    result = ex.submit(comfort, 3)
    assert ex.run_one()
    ex.submit(slow_stage_fault_injector(clock, 1, log, "planning"), 2)
    while ex.run_one():
        pass
    assert log == ["chunk0", "planning", "chunk1", "chunk2"]
    assert result.result(timeout=0) == "comfort-done"
    assert ex.estimate_ms("work") > 0.0


def test_a_newer_frame_replaces_a_waiting_unit_but_not_a_started_one() -> None:
    """Cancelling started units would starve a stream whose units outlast its frame period."""
    clock = FakeClock()
    ex = tiered(clock)

    def segment(tag: str) -> Callable[[], Generator[None, None, str]]:
        def run() -> Generator[None, None, str]:
            for _ in range(3):
                clock.advance_ms(1)
                yield
            return tag

        return run

    started = ex.submit(segment("first"), 2, arrival=ex.arrive("points"), name="seg")
    assert ex.run_one()
    waiting = ex.submit(segment("second"), 2, arrival=ex.arrive("points"), name="seg")
    newest = ex.submit(segment("third"), 2, arrival=ex.arrive("points"), name="seg")
    while ex.run_one():
        pass
    assert started.result(timeout=0) == "first"
    with pytest.raises(CancelledError, match="stale"):
        waiting.result(timeout=0)
    assert newest.result(timeout=0) == "third"
    assert drops(ex, "2")["stale"] == 1


def test_degraded_mode_skips_speculation_and_subsamples_the_far_field() -> None:
    clock = FakeClock()
    log: list[str] = []
    ex = tiered(
        clock, degrade_enter_backlog_ms=50.0, degrade_exit_backlog_ms=10.0, degrade_hold_s=0.5
    )
    assert not ex.degraded and ex.far_field_keep_fraction() == 1.0
    for k in range(4):
        ex.submit(slow_stage_fault_injector(clock, 20, log, f"w{k}"), 4, est_ms=20.0)
    assert ex.degraded and ex.far_field_keep_fraction() == 0.5
    spec = ex.submit(lambda: None, 4, speculative=True)
    with pytest.raises(CancelledError, match="degraded"):
        spec.result(timeout=0)
    while ex.run_one():
        pass
    assert not ex.degraded
    snap = ex.snapshot()
    assert snap["degraded_entries"] == 1 and snap["degraded_s"] > 0.0
    assert drops(ex, "4")["degraded"] == 1


def test_a_shed_holds_degraded_mode_for_the_hold_time() -> None:
    clock = FakeClock()
    ex = tiered(
        clock, degrade_enter_backlog_ms=1000.0, degrade_exit_backlog_ms=100.0, degrade_hold_s=1.0
    )
    ex.submit(lambda: None, 2, est_ms=60.0)
    assert not ex.degraded
    ex.submit(lambda: None, 2, est_ms=60.0)
    assert drops(ex, "2")["admission"] == 1
    assert ex.degraded
    clock.advance_ms(999)
    assert ex.degraded
    clock.advance_ms(2)
    assert not ex.degraded


def test_compiles_pause_around_tier_one_only() -> None:
    clock, pool = FakeClock(), RecordingPool()
    log: list[str] = []
    ex = TieredExecutor(pools=[pool, None], clock=clock, start=False)
    ex.submit(slow_stage_fault_injector(clock, 1, log, "t2"), 2)
    ex.submit(slow_stage_fault_injector(clock, 1, log, "t1"), 1)
    ex.run_one()
    assert pool.calls == ["pause", "resume"]
    ex.run_one()
    assert pool.calls == ["pause", "resume"]


def test_the_gates_are_held_while_any_unit_is_queued_or_running() -> None:
    clock, gate = FakeClock(), RecordingGate()
    log: list[str] = []
    ex = TieredExecutor(gates=[gate], clock=clock, start=False)
    ex.submit(slow_stage_fault_injector(clock, 1, log, "t2"), 2)
    ex.submit(slow_stage_fault_injector(clock, 1, log, "t3"), 3)
    assert gate.calls == ["enter"]
    ex.run_one()
    assert gate.calls == ["enter"], "a unit still queued keeps the gate held"
    ex.run_one()
    assert gate.calls == ["enter", "leave"]
    assert not ex.run_one() and gate.calls == ["enter", "leave"]
    cancelled = ex.submit(slow_stage_fault_injector(clock, 1, log, "never"), 2)
    assert cancelled.cancel()
    ex.run_one()
    assert gate.calls == ["enter", "leave", "enter", "leave"]
    assert log == ["t2", "t3"]


def test_a_shed_unit_lets_go_of_the_gates() -> None:
    clock, gate = FakeClock(), RecordingGate()
    ex = TieredExecutor(gates=[gate], clock=clock, start=False)
    late = ex.submit(lambda: "late", 2)
    clock.advance_ms(101)
    assert not ex.run_one()
    assert drops(ex, "2")["expired"] == 1
    with pytest.raises(CancelledError, match="expired"):
        late.result(timeout=0)
    assert gate.calls == ["enter", "leave"]


def test_closing_lets_go_of_the_gates_once_the_running_unit_ends() -> None:
    gate = RecordingGate()
    started, release = threading.Event(), threading.Event()

    def frame() -> bool:
        started.set()
        return release.wait(WAIT_S)

    options = ExecutorOptions(reserved_workers=0, shared_workers=1)
    with TieredExecutor(options=options, gates=[gate]) as ex:
        running = ex.submit(frame, 2)
        queued = ex.submit(lambda: None, 3)
        assert started.wait(WAIT_S)
        threading.Timer(0.05, release.set).start()
    assert running.result(timeout=0) is True and queued.done()
    assert gate.calls == ["enter", "leave"]


def test_a_failing_unit_fails_its_future_and_is_counted() -> None:
    ex = tiered(FakeClock())

    def broken() -> None:
        raise ValueError("injected stage failure")

    future = ex.submit(broken, 2)
    ex.run_one()
    with pytest.raises(ValueError, match="injected"):
        future.result(timeout=0)
    tier2 = ex.snapshot()["tiers"]["2"]
    assert (tier2["failed"], tier2["completed"]) == (1, 0)


def test_a_stage_that_exits_fails_its_future_and_the_lane_lives_on() -> None:
    def exiting_stage_fault_injector() -> None:
        raise SystemExit("injected sys.exit in a stage")

    with TieredExecutor(options=ExecutorOptions(reserved_workers=1, shared_workers=1)) as ex:
        failed = ex.submit(exiting_stage_fault_injector, 2)
        with pytest.raises(SystemExit, match="injected"):
            failed.result(timeout=WAIT_S)
        assert ex.submit(lambda: 42, 2).result(timeout=WAIT_S) == 42
        assert ex.drain(WAIT_S)
        assert ex.snapshot()["tiers"]["2"]["failed"] == 1


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"est_ms": float("nan")}, "est_ms"),
        ({"est_ms": -1.0}, "est_ms"),
        ({"est_ms": float("inf")}, "est_ms"),
        ({"size": float("nan")}, "size"),
        ({"size": 2.5}, "size"),
        ({"size": -1}, "size"),
    ],
)
def test_bad_unit_estimates_are_refused(changes: dict[str, Any], match: str) -> None:
    ex = tiered(FakeClock())
    with pytest.raises(ConfigError, match=match):
        ex.submit(lambda: None, 2, **changes)
    assert ex.snapshot()["tiers"]["2"]["submitted"] == 0


def test_a_non_finite_arrival_is_refused() -> None:
    ex = tiered(FakeClock())
    with pytest.raises(ConfigError, match="arrival time"):
        ex.submit(lambda: None, 1, arrival=Arrival("points", float("nan")))


def test_a_cancelled_future_is_not_run_and_is_counted() -> None:
    clock = FakeClock()
    log: list[str] = []
    ex = tiered(clock)
    future = ex.submit(slow_stage_fault_injector(clock, 1, log, "x"), 3)
    assert future.cancel()
    assert ex.run_one()
    assert log == [] and drops(ex, "3")["cancelled"] == 1


def test_fifo_ignores_tiers_drops_at_the_tail_and_runs_units_whole() -> None:
    clock = FakeClock()
    log: list[str] = []
    ex = FifoExecutor(TierConfig(max_queue_depth=3), clock=clock, start=False)

    def chunked() -> Generator[None, None, str]:
        for k in range(2):
            log.append(f"c{k}")
            yield
        return "whole"

    whole = ex.submit(chunked, 4)
    ex.submit(slow_stage_fault_injector(clock, 30, log, "t3"), 3)
    ex.submit(slow_stage_fault_injector(clock, 1, log, "t1"), 1)
    dropped = ex.submit(slow_stage_fault_injector(clock, 1, log, "t1b"), 1)
    while ex.run_one():
        pass
    assert log == ["c0", "c1", "t3", "t1"]
    assert whole.result(timeout=0) == "whole"
    with pytest.raises(CancelledError):
        dropped.result(timeout=0)
    tier1 = ex.snapshot()["tiers"]["1"]
    assert (tier1["misses"], tier1["dropped_by"]["admission"]) == (1, 1)


def test_transport_latency_is_reported_apart_from_deadlines() -> None:
    clock = FakeClock()
    ex = TieredExecutor(clock=clock, wall_clock=lambda: 50.030, start=False)
    arrival = ex.arrive("points", stamp_s=50.0)
    assert arrival.transport_ms == pytest.approx(30.0)
    ex.submit(lambda: None, 1, arrival=arrival)
    ex.run_one()
    snap = ex.snapshot()
    assert snap["transport"]["points"]["max_ms"] == pytest.approx(30.0)
    # The deadline counts from arrival: 30 ms in transit do not make a tier-1 miss.
    assert snap["tiers"]["1"]["misses"] == 0


def test_diagnostic_status_levels() -> None:
    clock = FakeClock()
    ex = tiered(clock)
    ex.submit(lambda: None, 1)
    ex.run_one()
    level, message, values = diagnostic_status(ex.snapshot())
    assert level == 0 and message == "all deadlines met"
    assert ("tier1.collision.misses", "0") in values
    ex.submit(lambda: None, 2)
    clock.advance_ms(200)
    ex.run_one()
    assert diagnostic_status(ex.snapshot())[0] == 1
    ex.submit(lambda: clock.advance_ms(20), 1)
    ex.run_one()
    assert diagnostic_status(ex.snapshot())[:2] == (2, "tier 1 missed or failed 1 deadline(s)")


def test_reserved_lane_is_not_held_up_by_running_lower_tier_work() -> None:
    blocking = BlockingStageFaultInjector("lower")
    with TieredExecutor() as ex:
        lower = ex.submit(blocking, 3)
        assert blocking.started.wait(WAIT_S)
        assert ex.submit(lambda: "collision", 1).result(timeout=WAIT_S) == "collision"
        assert not lower.done()
        blocking.release.set()
        assert lower.result(timeout=WAIT_S) == "lower"


def test_a_shared_lane_leaves_tier_one_to_an_idle_reserved_lane() -> None:
    """A frame's near field and full cloud, queued one after the other: the full cloud
    must not wait behind a near field that the shared lane took from an idle reserved lane."""
    near = BlockingStageFaultInjector("near")
    lanes: dict[str, str] = {}

    def full_cloud() -> str:
        lanes["full"] = threading.current_thread().name
        return "full"

    def near_field() -> str:
        lanes["near"] = threading.current_thread().name
        return near()

    options = ExecutorOptions(reserved_workers=1, shared_workers=1)
    with TieredExecutor(options=options) as ex:
        for _ in range(1000):
            with ex._cv:
                if ex._idle_reserved:
                    break
            near.release.wait(0.01)
        assert ex._idle_reserved == 1
        held = ex.submit(near_field, 1)
        assert ex.submit(full_cloud, 2).result(timeout=WAIT_S) == "full"
        assert not held.done()
        near.release.set()
        assert held.result(timeout=WAIT_S) == "near"
    assert "-reserved-" in lanes["near"] and "-shared-" in lanes["full"]


def test_a_shared_lane_takes_tier_one_only_when_no_reserved_lane_waits() -> None:
    clock = FakeClock()
    ex = tiered(clock)
    ex.submit(lambda: "near", 1)
    lower = ex.submit(lambda: "full", 2)
    # What a reserved lane waiting for work in ``_serve`` counts.
    ex._idle_reserved = 1
    assert ex.run_one("shared") and lower.result(timeout=0) == "full"
    assert not ex.run_one("shared")
    ex._idle_reserved = 0
    assert ex.run_one("shared")


def test_fifo_holds_tier_one_behind_running_work() -> None:
    release = threading.Event()
    both_started = threading.Barrier(3)

    def blocking_stage_fault_injector() -> None:
        both_started.wait(WAIT_S)
        release.wait(WAIT_S)

    with FifoExecutor() as ex:
        ex.submit(blocking_stage_fault_injector, 3)
        ex.submit(blocking_stage_fault_injector, 3)
        both_started.wait(WAIT_S)
        collision = ex.submit(lambda: "collision", 1)
        assert not release.wait(0.05)
        assert not collision.done()
        release.set()
        assert collision.result(timeout=WAIT_S) == "collision"


def test_close_drops_queued_work_joins_workers_and_refuses_more() -> None:
    blocking = BlockingStageFaultInjector("finished")
    ex = TieredExecutor(options=ExecutorOptions(reserved_workers=1, shared_workers=1))
    running = ex.submit(blocking, 2)
    assert blocking.started.wait(WAIT_S)
    queued = [ex.submit(lambda: None, 3) for _ in range(3)]
    closer = threading.Thread(target=ex.close)
    closer.start()
    for future in queued:
        with pytest.raises(CancelledError, match="shutdown"):
            future.result(timeout=WAIT_S)
    blocking.release.set()
    closer.join(WAIT_S)
    assert not closer.is_alive()
    assert running.result(timeout=0) == "finished"
    assert drops(ex, "3")["shutdown"] == 3
    assert all(not t.is_alive() for t in threading.enumerate() if t.name.startswith("tiered-"))
    with pytest.raises(SchedulingError, match="shut down"):
        ex.submit(lambda: None, 1)


def test_drain_waits_for_queued_and_running_work() -> None:
    with TieredExecutor() as ex:
        futures = [ex.submit(returning(k), 1 + k % 4) for k in range(20)]
        assert ex.drain(WAIT_S)
        assert [f.result(timeout=0) for f in futures] == list(range(20))


def test_executor_options_are_validated() -> None:
    with pytest.raises(ConfigError, match="shared_workers >= 1"):
        ExecutorOptions(shared_workers=0)
    with pytest.raises(ConfigError, match="switch_interval_ms"):
        ExecutorOptions(switch_interval_ms=0.0)


def test_switch_interval_is_set_while_running_and_restored() -> None:
    import sys

    before = sys.getswitchinterval()
    with TieredExecutor(options=ExecutorOptions(switch_interval_ms=0.5)):
        assert sys.getswitchinterval() == pytest.approx(0.0005)
    assert sys.getswitchinterval() == before


def test_reserved_lanes_ask_for_realtime_scheduling(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    calls: list[tuple[int, int, int]] = []

    def record(tid: int, policy: int, param: os.sched_param) -> None:
        calls.append((tid, policy, param.sched_priority))

    monkeypatch.setattr(os, "sched_setscheduler", record)
    options = ExecutorOptions(reserved_workers=1, shared_workers=2, reserved_rt_priority=20)
    with TieredExecutor(options=options) as ex:
        assert ex.submit(lambda: "ran", 1).result(timeout=WAIT_S) == "ran"
    assert ex.snapshot()["realtime_lanes"] == 1
    # Only the one reserved lane asks; shared lanes keep normal scheduling.
    assert [c[1:] for c in calls] == [(os.SCHED_FIFO, 20)]


def test_shared_lanes_are_boosted_only_while_tier_one_work_is_pending(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Priority inheritance for the GIL: the boost covers tier-1 work and nothing else."""
    import os

    calls: list[tuple[int, int]] = []
    monkeypatch.setattr(
        os,
        "sched_setscheduler",
        lambda tid, policy, param: calls.append((policy, param.sched_priority)),
    )
    blocking = BlockingStageFaultInjector("collision")
    options = ExecutorOptions(reserved_workers=1, shared_workers=2, shared_boost_rt_priority=5)
    with TieredExecutor(options=options) as ex:
        assert ex.submit(lambda: "planning", 2).result(timeout=WAIT_S) == "planning"
        assert ex.drain(WAIT_S) and calls == []
        collision = ex.submit(blocking, 1)
        assert blocking.started.wait(WAIT_S)
        assert calls == [(os.SCHED_FIFO, 5)] * 2
        blocking.release.set()
        assert collision.result(timeout=WAIT_S) == "collision"
        assert ex.drain(WAIT_S)
        assert calls[2:] == [(os.SCHED_OTHER, 0)] * 2
        assert ex.snapshot()["shared_boosts"] == 1


def test_shared_lanes_take_the_configured_nice_value(monkeypatch: pytest.MonkeyPatch) -> None:
    import os

    calls: list[tuple[int, int, int]] = []
    monkeypatch.setattr(
        os, "setpriority", lambda which, tid, nice: calls.append((which, tid, nice))
    )
    options = ExecutorOptions(reserved_workers=1, shared_workers=2, shared_nice=-5)
    with TieredExecutor(options=options) as ex:
        assert ex.submit(lambda: "ran", 2).result(timeout=WAIT_S) == "ran"
    assert [(c[0], c[2]) for c in calls] == [(os.PRIO_PROCESS, -5)] * 2
    with pytest.raises(ConfigError, match="shared_nice"):
        ExecutorOptions(shared_nice=-21)


def test_refused_realtime_scheduling_is_a_warning(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import os

    def refuse(tid: int, policy: int, param: os.sched_param) -> None:
        raise PermissionError("injected: no CAP_SYS_NICE")

    monkeypatch.setattr(os, "sched_setscheduler", refuse)
    with TieredExecutor(options=ExecutorOptions(reserved_rt_priority=20)) as ex:
        assert ex.submit(lambda: "ran", 1).result(timeout=WAIT_S) == "ran"
    assert ex.snapshot()["realtime_lanes"] == 0
    assert "SCHED_FIFO refused" in caplog.text
    with pytest.raises(ConfigError, match="reserved_rt_priority"):
        ExecutorOptions(reserved_rt_priority=0)
    with pytest.raises(ConfigError, match="must stay below reserved_rt_priority"):
        ExecutorOptions(reserved_rt_priority=5, shared_boost_rt_priority=5)


def test_a_started_unit_finishes_even_past_its_deadline() -> None:
    clock = FakeClock()
    ex = tiered(clock)

    def planning() -> Generator[None, None, str]:
        for _ in range(3):
            clock.advance_ms(60)
            yield
        return "planned"

    future = ex.submit(planning, 2)
    while ex.run_one():
        pass
    assert future.result(timeout=0) == "planned"
    tier2 = ex.snapshot()["tiers"]["2"]
    assert (tier2["misses"], tier2["dropped"]) == (1, 0)


def test_only_the_tiered_executor_boosts_shared_lanes_for_tier_one() -> None:
    """A FIFO knows no tier 1: its lanes run every unit at normal scheduling."""
    options = ExecutorOptions(reserved_rt_priority=10, shared_boost_rt_priority=5)
    gate = threading.Event()
    boosts = {}
    for kind in (TieredExecutor, FifoExecutor):
        ex = kind(options=options)
        try:
            done = [ex.submit(gate.wait, 2), ex.submit(lambda: None, 1)]
            gate.set()
            for future in done:
                future.result(timeout=WAIT_S)
            boosts[kind.kind] = ex.snapshot()["shared_boosts"]
        finally:
            gate.clear()
            ex.close()
    assert boosts["fifo"] == 0
    if boosts["tiered"] == 0:
        pytest.skip("no permission to boost lanes here (needs CAP_SYS_NICE)")


def test_a_sample_window_keeps_the_newest_in_order() -> None:
    window = Window(3)
    assert len(window) == 0 and window.copy().size == 0
    for value in (1.0, 2.0):
        window.append(value)
    assert window.copy().tolist() == [1.0, 2.0]
    for value in (3.0, 4.0, 5.0):
        window.append(value)
    held = window.copy()
    assert len(window) == 3 and held.tolist() == [3.0, 4.0, 5.0]
    window.append(6.0)
    assert held.tolist() == [3.0, 4.0, 5.0], "a copy must not change with the window"
    assert window.copy().tolist() == [4.0, 5.0, 6.0]
    with pytest.raises(ConfigError, match="at least 1"):
        Window(0)


def test_tier_percentiles_cover_only_the_latency_window() -> None:
    clock = FakeClock()
    ex = TieredExecutor(clock=clock, start=False, options=ExecutorOptions(latency_window=4))
    for ms in (400.0, 400.0, 1.0, 2.0, 3.0, 4.0):
        arrival = ex.arrive("points")
        ex.submit(lambda: None, Tier.COMFORT, arrival=arrival)
        clock.advance_ms(ms)
        assert ex.run_one("shared")
    tier = ex.snapshot()["tiers"]["3"]
    assert tier["max_ms"] == 4.0 and tier["completed"] == 6
