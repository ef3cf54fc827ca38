"""Topic rate and stamp checks fed at each update give what diagnostic_updater's ticks give."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from diagnostic_msgs.msg import DiagnosticStatus
from diagnostic_updater import (
    DiagnosticStatusWrapper,
    FrequencyStatusParam,
    HeaderlessTopicDiagnostic,
    TimeStampStatusParam,
    TopicDiagnostic,
    Updater,
)
from rclpy.node import Node

from dynshape_perception.nodes.diagnostics import MAX_PENDING_TICKS, TopicTicks
from dynshape_perception.testing.processes import leased_context

pytestmark = pytest.mark.ros

FREQ = FrequencyStatusParam({"min": 5.0, "max": 20.0}, 0.1, 5)
STAMP = TimeStampStatusParam(-1.0, 5.0)
# The two take the time a few microseconds apart: delays agree far within this.
DELAY_TOLERANCE_S = 0.5
DELAY_KEYS = ("Earliest timestamp delay:", "Latest timestamp delay:")
# The rate check's window runs from when each check was made or last ran, microseconds
# apart: the events in it are compared, not its length or the rate that gives.
WINDOW_KEYS = ("Duration of window (s)", "Actual frequency (Hz)")


@pytest.fixture
def updater() -> Iterator[Updater]:
    with leased_context() as context:
        node = Node("topic_ticks", context=context)
        yield Updater(node)
        node.destroy_node()


def _status(check: Any) -> tuple[int, str, dict[str, str]]:
    stat = check.run(DiagnosticStatusWrapper())
    return int.from_bytes(stat.level, "little"), stat.message, {v.key: v.value for v in stat.values}


def _same(got: tuple[int, str, dict[str, str]], want: tuple[int, str, dict[str, str]]) -> None:
    assert got[:2] == want[:2]
    assert got[2].keys() == want[2].keys()
    for key, value in want[2].items():
        if key in WINDOW_KEYS:
            continue
        if key in DELAY_KEYS:
            assert float(got[2][key]) == pytest.approx(float(value), abs=DELAY_TOLERANCE_S)
        else:
            assert got[2][key] == value, key


@pytest.mark.parametrize(
    "offsets_s",
    [
        [0.0, 0.0, 0.0],  # on time
        [-10.0, 0.0],  # one too far in the past
        [3.0, 0.0, -2.0],  # one too far in the future
        [None, None],  # stamps that cannot be read: the rate only
        [],  # nothing since the last update
    ],
)
def test_stamped_topic_reports_what_the_library_ticks_report(
    updater: Updater, offsets_s: list[float | None]
) -> None:
    library = TopicDiagnostic("/library", updater, FREQ, STAMP)
    ticks = TopicTicks(TopicDiagnostic("/logged", updater, FREQ, STAMP))
    for round_ in range(2):
        for offset in offsets_s:
            stamp = None if offset is None else time.time() + offset
            if stamp is None:
                HeaderlessTopicDiagnostic.tick(library)
            else:
                library.tick(stamp)
            ticks.tick(stamp)
        ticks.fold()
        _same(_status(ticks.check), _status(library))
        assert not ticks.pending, round_


def test_a_zero_stamp_is_an_error_as_in_the_library(updater: Updater) -> None:
    library = TopicDiagnostic("/library", updater, FREQ, STAMP)
    ticks = TopicTicks(TopicDiagnostic("/logged", updater, FREQ, STAMP))
    for stamp in (time.time(), 0.0):
        library.tick(stamp)
        ticks.tick(stamp)
    ticks.fold()
    got, want = _status(ticks.check), _status(library)
    assert got[0] == want[0] == int.from_bytes(DiagnosticStatus.ERROR, "little")
    _same(got, want)


def test_a_headerless_topic_counts_its_messages(updater: Updater) -> None:
    library = HeaderlessTopicDiagnostic("/library", updater, FREQ)
    ticks = TopicTicks(HeaderlessTopicDiagnostic("/logged", updater, FREQ))
    for _ in range(7):
        library.tick()
        ticks.tick(None)
    ticks.fold()
    _same(_status(ticks.check), _status(library))
    assert _status(ticks.check)[2]["Events since startup"] == "7"


def test_ticks_between_updates_stay_bounded(updater: Updater) -> None:
    ticks = TopicTicks(TopicDiagnostic("/logged", updater, FREQ, STAMP))
    for _ in range(MAX_PENDING_TICKS + 1):
        ticks.tick(time.time())
    assert not ticks.pending
    ticks.tick(time.time())
    assert len(ticks.pending) == 1
    ticks.fold()
    assert _status(ticks.check)[2]["Events since startup"] == str(MAX_PENDING_TICKS + 2)
