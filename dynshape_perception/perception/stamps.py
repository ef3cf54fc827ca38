"""Input stamps screened: a lone outlier is dropped, only a sustained jump starts a new timeline."""

from __future__ import annotations

import math
from dataclasses import dataclass

from dynshape_perception.paramspec import MAX_STAMP_TOLERANCE_S, check_fields, param

# What ``StampScreen.check`` decides. ACCEPT: on the timeline (the caller still drops a stamp
# not after its newest as stale); RESTART: a sustained jump back, to be taken after the
# state that depends on time restarts; FUTURE and OUTLIER: dropped, no state moved.
ACCEPT = "accept"
RESTART = "restart"
FUTURE_STAMP = "future_stamp"
OUTLIER_STAMP = "outlier_stamp"


MIN_STAMP_TOLERANCE_S = 0.01
MAX_CONFIRM_FRAMES = 1000


@dataclass(frozen=True)
class StampPolicy:
    """How far a stamp may stray before it is held back, and what confirms a jump."""

    future_tolerance_s: float = param(
        5.0,
        "an input stamped further than this ahead of the node's clock is dropped "
        "(future_stamp) and never advances the node's state",
        low=MIN_STAMP_TOLERANCE_S,
        high=MAX_STAMP_TOLERANCE_S,
    )
    jump_back_tolerance_s: float = param(
        10.0,
        "an input stamped further than this before the newest one jumps back in time (a "
        "looped bag, a clock reset): dropped as outlier_stamp until "
        "stamps.jump_confirm_frames in a row follow it, then tracks and odometry "
        "restart (time_jump_reset); a smaller step back is dropped as stale",
        low=MIN_STAMP_TOLERANCE_S,
        high=MAX_STAMP_TOLERANCE_S,
    )
    jump_ahead_tolerance_s: float = param(
        2.0,
        "an input stamped further than this after the newest one, beyond how far the "
        "node's clock ran meanwhile, jumps ahead: dropped as outlier_stamp until "
        "stamps.jump_confirm_frames in a row follow it, so that one stray stamp cannot "
        "make the inputs after it stale (a pause of the input, the clock running on, is "
        "no jump)",
        low=MIN_STAMP_TOLERANCE_S,
        high=MAX_STAMP_TOLERANCE_S,
    )
    jump_confirm_frames: int = param(
        3,
        "inputs in a row, each after the one before, that make a time jump a new "
        "timeline; 1 takes every jump at once",
        low=1,
        high=MAX_CONFIRM_FRAMES,
    )

    def __post_init__(self) -> None:
        check_fields(self)


@dataclass(frozen=True)
class Screened:
    """A verdict (``ACCEPT``, ``RESTART``, ``FUTURE_STAMP``, ``OUTLIER_STAMP``) and why."""

    verdict: str
    reason: str = ""

    @property
    def dropped(self) -> bool:
        return self.verdict in (FUTURE_STAMP, OUTLIER_STAMP)


class StampScreen:
    """Screens one input's stamps against its newest accepted one and the node's clock.

    A stamp that is not positive (unset, or a year-2100 time wrapped on the 32-bit wire) is
    an outlier: dropped, so that it moves no state. So is one more than
    ``jump_back_tolerance_s`` before the newest stamp, or one that ran ahead of it by more
    than ``jump_ahead_tolerance_s`` beyond what the node's clock advanced meanwhile: a gap
    in the input (the clock ran on too) is no jump, a stray stamp seconds ahead is. Without
    a clock every step ahead counts. An outlier starts a run; once ``jump_confirm_frames``
    stamps in a row follow it (each after the one before, within the ahead tolerance), the
    run is a new timeline: a jump back restarts the state (a looped bag, a reset clock), a
    jump ahead simply goes on. A stamp back on the old timeline ends the run.
    """

    def __init__(self, policy: StampPolicy) -> None:
        self.policy = policy
        self._run: list[float] = []
        # The newest stamp taken and the clock when it was: how far the clock ran since.
        self._taken: tuple[float, float] | None = None

    def clear(self) -> None:
        """Forget a run under way (the state restarted for another input's jump)."""
        self._run.clear()
        self._taken = None

    def _ahead_s(self, stamp_s: float, newest_s: float, now_s: float) -> float:
        """How far ``stamp_s`` ran ahead of the newest stamp this screen took (``newest_s``
        or one after it: the caller may drop what the screen passed, for want of a pose),
        less what the clock ran since."""
        taken = self._taken
        if now_s > 0.0 and taken is not None and taken[0] >= newest_s and taken[1] > 0.0:
            return stamp_s - taken[0] - (now_s - taken[1])
        return stamp_s - newest_s

    def _take(self, stamp_s: float, now_s: float, screened: Screened) -> Screened:
        if self._taken is None or stamp_s > self._taken[0]:
            self._taken = (stamp_s, now_s)
        return screened

    def check(self, stamp_s: float, newest_s: float | None, now_s: float) -> Screened:
        """The verdict on ``stamp_s``, given the newest accepted stamp and the node's clock
        (``now_s`` <= 0: no clock yet, as in sim time before the first /clock)."""
        policy = self.policy
        if not (math.isfinite(stamp_s) and stamp_s > 0.0):
            return Screened(OUTLIER_STAMP, f"stamp {stamp_s:.6f} s is not a positive time")
        if now_s > 0.0 and stamp_s - now_s > policy.future_tolerance_s:
            return Screened(
                FUTURE_STAMP,
                f"stamp {stamp_s:.6f} s is {stamp_s - now_s:.3f} s ahead of the node's clock "
                f"(stamps.future_tolerance_s {policy.future_tolerance_s})",
            )
        if newest_s is None:
            self._run.clear()
            return self._take(stamp_s, now_s, Screened(ACCEPT))
        step = stamp_s - newest_s
        ahead = self._ahead_s(stamp_s, newest_s, now_s)
        if -policy.jump_back_tolerance_s <= step and ahead <= policy.jump_ahead_tolerance_s:
            self._run.clear()
            return self._take(stamp_s, now_s, Screened(ACCEPT))
        run = self._run
        if run and 0.0 < stamp_s - run[-1] <= policy.jump_ahead_tolerance_s:
            run.append(stamp_s)
        else:
            run[:] = [stamp_s]
        direction = "back" if step < 0.0 else "ahead"
        if len(run) >= policy.jump_confirm_frames:
            run.clear()
            if step < 0.0:
                self._taken = None
            return self._take(
                stamp_s,
                now_s,
                Screened(
                    RESTART if step < 0.0 else ACCEPT,
                    f"time jumped {direction} {abs(step):.3f} s (from {newest_s:.6f} s to "
                    f"{stamp_s:.6f} s) for {policy.jump_confirm_frames} input(s) in a row",
                ),
            )
        tolerance = policy.jump_back_tolerance_s if step < 0.0 else policy.jump_ahead_tolerance_s
        where = (
            f"lies {-step:.3f} s before the newest {newest_s:.6f} s"
            if step < 0.0
            else f"ran {ahead:.3f} s further ahead of the newest {newest_s:.6f} s than the clock"
        )
        return Screened(
            OUTLIER_STAMP,
            f"stamp {stamp_s:.6f} s {where} (tolerance {tolerance} s): {len(run)} of "
            f"{policy.jump_confirm_frames} input(s) in a row needed to take the jump",
        )
