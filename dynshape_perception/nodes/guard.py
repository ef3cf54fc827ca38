"""One guard around every subscription callback: nothing a message does reaches the executor."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Protocol


class Failing(Protocol):
    """What the guard needs of a node: a way to count a failure, and whether it is closing."""

    def count_failure(self, what: str, err: Exception) -> None: ...

    def failures_count(self) -> bool: ...


def guarded(node: Failing, what: str, callback: Callable[[Any], None]) -> Callable[[Any], None]:
    """``callback`` that lets no exception out. One it raises is counted by the node
    (``internal_error`` when no package error says what went wrong: a throttled warning with
    the traceback, ERROR on /diagnostics) and the node goes on with the next message."""

    def run(msg: Any) -> None:
        try:
            callback(msg)
        except Exception as err:  # noqa: BLE001 - an exception here would end rclpy.spin
            # A signal shuts the context down under a callback: no failure of the input.
            if node.failures_count():
                node.count_failure(what, err)

    return run


class InternalErrors:
    """Internal errors since the last report, and the latest one's text, for the input task."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._new = 0
        self.last = ""

    def add(self, text: str) -> None:
        with self._lock:
            self._new += 1
            self.last = text

    def take(self) -> tuple[int, str]:
        """How many came since the last call, and the latest's text."""
        with self._lock:
            new, self._new = self._new, 0
            return new, self.last
