"""Stamp screening without ROS: lone outliers dropped, sustained jumps taken, the clock checked."""

from __future__ import annotations

import pytest

from dynshape_perception.errors import ConfigError
from dynshape_perception.perception.stamps import (
    ACCEPT,
    FUTURE_STAMP,
    OUTLIER_STAMP,
    RESTART,
    StampPolicy,
    StampScreen,
)

NO_CLOCK = 0.0


def feed(screen: StampScreen, stamps: list[float], now_s: float = NO_CLOCK) -> list[str]:
    """Verdicts of a stream whose newest stamp advances on every stamp taken."""
    newest: float | None = None
    verdicts = []
    for stamp in stamps:
        screened = screen.check(stamp, newest, now_s)
        verdicts.append(screened.verdict)
        if screened.verdict == RESTART:
            newest = None
        if not screened.dropped and (newest is None or stamp > newest):
            newest = stamp
    return verdicts


def test_a_lone_stamp_off_the_timeline_is_an_outlier_either_way() -> None:
    screen = StampScreen(StampPolicy())
    steady = [100.0 + 0.1 * k for k in range(10)]
    for stray in (0.0, -5.0, float("nan"), 50.0, 104.9, 1e12):
        verdicts = feed(screen, [*steady, stray, *[s + 1.0 for s in steady]])
        assert verdicts[10] == OUTLIER_STAMP, stray
        assert set(verdicts[:10] + verdicts[11:]) == {ACCEPT}, stray


def test_a_jump_back_is_taken_after_the_confirm_frames() -> None:
    policy = StampPolicy(jump_back_tolerance_s=10.0, jump_confirm_frames=3)
    screen = StampScreen(policy)
    first = [100.0 + 0.1 * k for k in range(200)]
    again = [100.0 + 0.1 * k for k in range(5)]
    verdicts = feed(screen, first + again)[200:]
    assert verdicts == [OUTLIER_STAMP, OUTLIER_STAMP, RESTART, ACCEPT, ACCEPT]


def test_a_jump_ahead_is_taken_after_the_confirm_frames_without_a_restart() -> None:
    screen = StampScreen(StampPolicy(jump_ahead_tolerance_s=2.0, jump_confirm_frames=2))
    verdicts = feed(screen, [100.0, 100.1, 130.0, 130.1, 130.2])
    assert verdicts == [ACCEPT, ACCEPT, OUTLIER_STAMP, ACCEPT, ACCEPT]
    assert screen.check(160.0, 130.2, NO_CLOCK).dropped
    taken = screen.check(160.1, 130.2, NO_CLOCK)
    assert taken.verdict == ACCEPT and "time jumped ahead 29.900 s" in taken.reason


def test_a_run_must_be_consecutive_and_in_order() -> None:
    screen = StampScreen(StampPolicy(jump_confirm_frames=3))
    old = [1000.0 + 0.1 * k for k in range(200)]
    # Stray stamps that do not follow each other never make a timeline.
    strays = [10.0, 500.0, 10.1, 500.1, 9.0, 8.0]
    assert set(feed(screen, old + strays)[200:]) == {OUTLIER_STAMP}
    # One stamp back on the old timeline ends a run under way.
    screen = StampScreen(StampPolicy(jump_confirm_frames=3))
    verdicts = feed(screen, [*old, 10.0, 10.1, 1020.0, 10.2, 10.3, 10.4])[200:]
    assert verdicts == [OUTLIER_STAMP] * 2 + [ACCEPT] + [OUTLIER_STAMP] * 2 + [RESTART]


def test_a_gap_the_clock_ran_through_is_no_jump_but_a_stray_stamp_is() -> None:
    """Live: stamps follow the node's clock. A sensor silent for 30 s comes back on time; a
    stamp 4.9 s ahead of a clock that ran 0.5 s is a glitch."""
    screen = StampScreen(StampPolicy(jump_ahead_tolerance_s=2.0))
    latency = 0.02
    clock = 1000.0
    assert screen.check(clock - latency, None, clock).verdict == ACCEPT
    clock += 30.0
    assert screen.check(clock - latency, 1000.0 - latency, clock).verdict == ACCEPT
    clock += 0.5
    stray = screen.check(clock + 4.9 - latency, 1030.0 - latency, clock)
    assert stray.verdict == OUTLIER_STAMP and "4.900 s further ahead" in stray.reason
    clock += 0.5
    assert screen.check(clock - latency, 1030.0 - latency, clock).verdict == ACCEPT


def test_frames_dropped_after_the_screen_keep_its_reference_through_a_gap() -> None:
    """Frames the screen passed but the caller dropped (no pose: odom_stale, tf_unavailable)
    leave the caller's newest stamp behind; the screen still knows the stamp and the clock it
    last took, so neither the outage nor a gap after it is a jump."""
    screen = StampScreen(StampPolicy(jump_ahead_tolerance_s=2.0))
    newest = 1000.0
    assert screen.check(newest, None, newest).verdict == ACCEPT
    # 5 s of frames at 10 Hz, each dropped after the screen: the newest stays at 1000 s.
    for k in range(1, 51):
        stamp = newest + 0.1 * k
        assert screen.check(stamp, newest, stamp + 0.02).verdict == ACCEPT, k
    # 3 s of silence, then the pose is back.
    assert screen.check(1008.0, newest, 1008.02).verdict == ACCEPT


def test_one_confirm_frame_takes_every_jump_at_once() -> None:
    screen = StampScreen(StampPolicy(jump_confirm_frames=1))
    assert feed(screen, [100.0, 200.0, 50.0]) == [ACCEPT, ACCEPT, RESTART]
    assert feed(StampScreen(StampPolicy(jump_confirm_frames=1)), [100.0, 0.0]) == [
        ACCEPT,
        OUTLIER_STAMP,
    ]


def test_the_future_is_judged_by_the_clock_when_there_is_one() -> None:
    screen = StampScreen(StampPolicy(future_tolerance_s=5.0))
    ahead = screen.check(1006.0, None, now_s=1000.0)
    assert ahead.verdict == FUTURE_STAMP and "6.000 s ahead" in ahead.reason
    assert screen.check(1004.0, None, now_s=1000.0).verdict == ACCEPT
    assert screen.check(1006.0, None, now_s=NO_CLOCK).verdict == ACCEPT


def test_clear_forgets_a_run() -> None:
    screen = StampScreen(StampPolicy(jump_confirm_frames=2))
    assert screen.check(10.0, 1000.0, NO_CLOCK).verdict == OUTLIER_STAMP
    screen.clear()
    assert screen.check(10.1, 1000.0, NO_CLOCK).verdict == OUTLIER_STAMP
    assert screen.check(10.2, 1000.0, NO_CLOCK).verdict == RESTART


@pytest.mark.parametrize(
    ("changes", "match"),
    [
        ({"future_tolerance_s": 0.0}, "future_tolerance_s"),
        ({"jump_back_tolerance_s": float("nan")}, "jump_back_tolerance_s"),
        ({"jump_ahead_tolerance_s": -1.0}, "jump_ahead_tolerance_s"),
        ({"jump_confirm_frames": 0}, "jump_confirm_frames"),
    ],
)
def test_bad_policies_are_refused(changes: dict[str, float], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        StampPolicy(**changes)  # type: ignore[arg-type]
