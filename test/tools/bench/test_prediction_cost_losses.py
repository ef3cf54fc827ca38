"""The node path's prediction cost counts a lost table and goes on; a silent node is an error."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

from dynshape_perception.errors import ConfigError
from dynshape_perception.tools.bench.prediction_cost import MAX_LOST_IN_A_ROW, node_cost

ANSWER_MS = 1.0
# lengths (2, 3), four phases: the length-2 run sends frames 0-8 (5-8 timed); the length-3
# run frames 0-16 (9-12 timed, 13-16 past the window), its round trips after those 9.
LENGTH_2_FRAMES = 9
UNTIMED_CALL = 2
TIMED_CALL = LENGTH_2_FRAMES + 10


class LosingRoundTripsFaultInjector:
    """Stands in for a prediction session whose nodes answer each table in ``ANSWER_MS``,
    except the round trips (variant, call number) it is told to lose."""

    def __init__(self, names: tuple[str, ...], lose: set[tuple[str, int]]) -> None:
        self.publishers = dict.fromkeys(names)
        self.lose = lose
        self.calls = dict.fromkeys(names, 0)

    def prime(self, first_ns: int, step_ns: int, attempts: int, timeout_s: float) -> int:
        return first_ns

    def check_alive(self) -> None:
        return None

    def forget(self, upto_stamp: int) -> None:
        return None

    def round_trip(self, name: str, stamp: int, rows: np.ndarray, timeout_s: float) -> float | None:
        call = self.calls[name]
        self.calls[name] += 1
        return None if (name, call) in self.lose else ANSWER_MS


def _cost(session: LosingRoundTripsFaultInjector) -> dict[str, Any]:
    return node_cost(session, (2, 3), agents=2, repeats=1)  # type: ignore[arg-type]


def test_a_lost_table_is_counted_and_its_frame_left_untimed() -> None:
    lose = {("incremental", UNTIMED_CALL), ("incremental", TIMED_CALL)}
    cost = _cost(LosingRoundTripsFaultInjector(("incremental", "full"), lose))
    assert cost["incremental_lost"] == 2 and cost["incremental_lost_timed"] == 1
    assert cost["full_lost"] == 0 and cost["full_lost_timed"] == 0
    frames = {
        name: {k: v["frames"] for k, v in cost[name].items()} for name in ("incremental", "full")
    }
    assert frames["incremental"] == {"2": 4, "3": 3, "past_window": 4}
    assert frames["full"] == {"2": 4, "3": 4, "past_window": 4}


def test_a_node_that_answers_nothing_in_a_row_is_an_error() -> None:
    lose = {("full", TIMED_CALL + k) for k in range(MAX_LOST_IN_A_ROW)}
    with pytest.raises(ConfigError, match="in a row"):
        _cost(LosingRoundTripsFaultInjector(("incremental", "full"), lose))
