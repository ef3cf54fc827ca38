"""/diagnostics through diagnostic_updater: one task per concern, rate and stamp per topic."""

from __future__ import annotations

import math
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager, nullcontext
from typing import Any

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

from dynshape_perception.perception.prediction.stage import PredictionStage, speculation_summary

# Task names: the analyzer YAML of config/ groups the statuses by them.
INPUT, POSE, JIT, TIERS = "input", "pose", "jit", "tiers"
PREDICTION, SECTORS = "prediction", "sectors"
# diagnostic_status levels 0, 1, 2 as DiagnosticStatus levels.
LEVELS = (DiagnosticStatus.OK, DiagnosticStatus.WARN, DiagnosticStatus.ERROR)
OK_MESSAGE = "ok"
# A task's values and problems for this period; its level is the worst problem's.
Report = tuple[int, list[str], Mapping[str, object]]
# Messages a topic's check holds for the next update; a tick past this folds them in itself.
MAX_PENDING_TICKS = 1024
NS_PER_S = 1_000_000_000


class TopicTicks:
    """A topic's messages, held for diagnostic_updater's rate and stamp check of it.

    The library's tick creates a clock and takes two locks per message: tens of µs on the
    frame path, once the frame's other work has left that code out of the caches
    (``scripts/cold_call_cost.py``). Here a message only appends its receipt time and
    stamp; each update (or a tick past ``MAX_PENDING_TICKS``) first folds them into the
    check as the library's ticks would have, one by one. A stamp of None counts for the
    rate check only.
    """

    def __init__(self, check: Any) -> None:
        # A TopicDiagnostic, or a HeaderlessTopicDiagnostic (no ``stamp`` status).
        self.check = check
        self._freq = check.freq
        self._stamp = getattr(check, "stamp", None)
        # (receipt ns, stamp s): appended and taken one by one, safe from any thread.
        self.pending: deque[tuple[int, float | None]] = deque()

    def tick(self, stamp_s: float | None) -> None:
        pending = self.pending
        # The library's stamp check reads a ROS_TIME clock of its own: the system time.
        pending.append((time.time_ns(), stamp_s))
        if len(pending) > MAX_PENDING_TICKS:
            self.fold()

    def fold(self) -> None:
        taken: list[tuple[int, float | None]] = []
        pending = self.pending
        while pending:
            try:
                taken.append(pending.popleft())
            except IndexError:
                break
        if not taken:
            return
        with self._freq.lock:
            self._freq.count += len(taken)
        status = self._stamp
        if status is None:
            return
        with status.lock:
            for received_ns, stamp_s in taken:
                if stamp_s is None:
                    continue
                if stamp_s == 0:
                    status.zero_seen = True
                    continue
                delta = (received_ns - stamp_s * NS_PER_S) * 1e-9
                if not status.deltas_valid or delta > status.max_delta:
                    status.max_delta = delta
                if not status.deltas_valid or delta < status.min_delta:
                    status.min_delta = delta
                status.deltas_valid = True


class NodeDiagnostics:
    """The node's ``diagnostic_updater.Updater``: a task per concern (each a function that
    reports its level, problems and values), and rate and stamp checks of the topics."""

    def __init__(
        self,
        node: Node,
        hardware_id: str,
        values: Mapping[str, Any],
        busy: Callable[[], bool] = lambda: False,
        turn: AbstractContextManager[Any] | None = None,
    ) -> None:
        self.updater = Updater(node)
        self.updater.setHardwareID(hardware_id)
        # An update takes milliseconds of the GIL (every task's values, hundreds of key-values
        # built and published): one that lands mid-frame is that frame's tail. It waits for
        # the node's frame work (``busy``) to end, then runs on the executor at once; a node
        # busy through a whole period reports at the next tick regardless.
        self._busy = busy
        # What the node's other callbacks hold: an update reads what they change.
        self._turn = turn if turn is not None else nullcontext()
        self._due = False
        self._due_lock = threading.Lock()
        self.updates = self.deferred = 0
        node.destroy_timer(self.updater.timer)
        self.updater.timer = node.create_timer(self.updater.period, self._on_period)
        self._wake = node.create_guard_condition(self._on_wake)
        self._freq = FrequencyStatusParam(
            {
                "min": float(values["diagnostics.min_rate_hz"]),
                "max": float(values["diagnostics.max_rate_hz"]),
            },
            float(values["diagnostics.rate_tolerance"]),
            int(values["diagnostics.rate_window"]),
        )
        self._stamp = TimeStampStatusParam(
            float(values["diagnostics.min_stamp_delay_s"]),
            float(values["diagnostics.max_stamp_delay_s"]),
        )
        self.topics: dict[str, TopicTicks] = {}

    def _on_period(self) -> None:
        with self._due_lock:
            defer = self._due = self._busy() and not self._due
        if defer:
            self.deferred += 1
        else:
            self._update()

    def work_ended(self) -> None:
        """The node's frame work has ended (a ``WorkCount`` listener: any thread, never
        blocks): a deferred update runs now, on the executor."""
        with self._due_lock:
            if self._due:
                self._wake.trigger()

    def _on_wake(self) -> None:
        with self._due_lock:
            due, self._due = self._due, False
        if due:
            self._update()

    def _update(self) -> None:
        with self._turn:
            self.updates += 1
            for ticks in self.topics.values():
                ticks.fold()
            self.updater.update()

    def add_task(self, name: str, report: Callable[[], Report]) -> None:
        def run(stat: DiagnosticStatusWrapper) -> DiagnosticStatusWrapper:
            try:
                level, problems, values = report()
            except Exception as err:  # noqa: BLE001 - the updater's timer must keep running
                level, problems, values = 2, [f"report failed: {err!r}"], {}
            stat.summary(LEVELS[min(max(level, 0), 2)], "; ".join(problems) or OK_MESSAGE)
            for key, value in values.items():
                stat.add(str(key), str(value))
            return stat

        self.updater.add(name, run)

    def topic(self, name: str, stamped: bool = True) -> None:
        """Rate checks of a topic, and stamp checks if its messages carry a header."""
        if name in self.topics:
            return
        check = (
            TopicDiagnostic(name, self.updater, self._freq, self._stamp)
            if stamped
            else HeaderlessTopicDiagnostic(name, self.updater, self._freq)
        )
        self.topics[name] = TopicTicks(check)

    def tick(self, name: str, stamp_s: float | None = None) -> None:
        """One message on ``name`` (with its header stamp, if it has one). A stamped topic's
        message whose stamp cannot be read counts for the rate check only."""
        if stamp_s is not None and not math.isfinite(stamp_s):
            stamp_s = None
        self.topics[name].tick(stamp_s)


def prediction_report(stage: PredictionStage) -> Report:
    """The prediction stage's counters; the message says what speculation saved, or why
    nothing (off, nothing verified or promoted yet, promotion no faster)."""
    values = stage.diagnostics()
    return 0, [speculation_summary(values)], {f"prediction.{k}": v for k, v in values.items()}
