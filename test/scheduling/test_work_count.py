"""A node's frame work, counted across its callbacks and its executor's units."""

from __future__ import annotations

import pytest

from dynshape_perception.scheduling.executor import TieredExecutor
from dynshape_perception.scheduling.work import WorkCount, holding
from dynshape_perception.testing.clocks import FakeClock


def test_nested_and_overlapping_work_ends_once_with_the_last_of_it() -> None:
    work, ended = WorkCount(), []
    work.listen(lambda: ended.append(work.busy))
    work.enter()
    with holding([work]):
        assert work.busy
    assert work.busy and ended == []
    work.leave()
    assert not work.busy
    # The listener saw the count at zero: it may act on the work having ended.
    assert ended == [False] and work.ends == 1
    with holding([work]):
        pass
    assert ended == [False, False] and work.ends == 2


def test_a_leave_without_an_enter_changes_nothing() -> None:
    work, ended = WorkCount(), []
    work.listen(lambda: ended.append(True))
    work.leave()
    assert ended == [] and work.ends == 0 and not work.busy
    work.enter()
    work.leave()
    assert ended == [True]


def test_work_that_fails_still_ends() -> None:
    work, ended = WorkCount(), []
    work.listen(lambda: ended.append(True))
    with pytest.raises(ValueError, match="injected"), holding([work]):
        raise ValueError("injected failure")
    assert ended == [True] and not work.busy


def test_an_executor_holds_the_work_from_its_first_queued_unit_to_its_last() -> None:
    clock, work, ended = FakeClock(), WorkCount(), []
    work.listen(lambda: ended.append(clock()))
    ex = TieredExecutor(gates=[work], clock=clock, start=False)
    # A frame callback that hands its units to the executor, as the lidar nodes do.
    with holding([work]):
        ex.submit(lambda: None, 2)
        ex.submit(lambda: None, 3)
    assert work.busy and ended == []
    ex.run_one()
    assert work.busy and ended == []
    clock.advance_ms(2)
    ex.run_one()
    assert not work.busy and ended == [pytest.approx(1000.002)]


class RefusingGateFaultInjector:
    """Fault injector: a gate whose enter fails."""

    def enter(self) -> None:
        raise RuntimeError("injected gate failure")

    def leave(self) -> None:
        raise AssertionError("a gate never entered is never left")


def test_holding_holds_every_gate_and_lets_go_of_each_it_entered() -> None:
    first, second = WorkCount(), WorkCount()
    with holding([first, second]):
        assert first.busy and second.busy
    assert not first.busy and not second.busy
    with pytest.raises(RuntimeError, match="injected gate failure"):
        with holding([first, RefusingGateFaultInjector(), second]):
            raise AssertionError("the block never runs")
    assert not first.busy and not second.busy and first.ends == 2 and second.ends == 1
