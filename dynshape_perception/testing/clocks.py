"""A clock that tests move by hand, so that whatever depends on time is checked exactly."""

from __future__ import annotations


class FakeClock:
    """Seconds that pass only through ``advance_ms``; passed where a ``clock`` is taken."""

    def __init__(self, start_s: float = 1000.0) -> None:
        self.now = start_s

    def __call__(self) -> float:
        return self.now

    def advance_ms(self, ms: float) -> None:
        self.now += ms / 1000.0
