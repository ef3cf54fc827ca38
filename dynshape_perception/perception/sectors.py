"""Streaming lidar input: sector clouds grouped into revolutions, by count or azimuth coverage."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from dynshape_perception.config import integer
from dynshape_perception.errors import ConfigError, InputValueError, ShapeError

AZIMUTH_BINS = 360
# A sector whose azimuth bins are mostly covered already starts the next revolution (a
# sector overlaps its neighbours at their edges only).
OVERLAP_SHARE = 0.5
DETECT = 0


@dataclass(frozen=True)
class Revolution:
    """One turn of the sensor: its sectors' points in arrival order, stamped by the last."""

    points: np.ndarray
    stamp_s: float
    first_stamp_s: float
    sectors: int
    # False when a lost sector or a time jump cut it short.
    complete: bool


@dataclass
class SectorCounters:
    sectors: int = 0
    empty_sectors: int = 0
    revolutions: int = 0
    incomplete_revolutions: int = 0
    # Sectors of a revolution that a time jump backwards discarded.
    discarded_sectors: int = 0
    # Revolutions complete by the configured count whose next sector went on into azimuths
    # they had not covered: the count is below the driver's, and each was part of a scan.
    short_revolutions: int = 0

    def as_dict(self) -> dict[str, int]:
        return dict(vars(self))


def azimuth_centre(points: np.ndarray) -> float | None:
    """The circular mean azimuth of a cloud's points (radians); None when it has none."""
    x = points[:, 0].astype(np.float64)
    y = points[:, 1].astype(np.float64)
    r = np.hypot(x, y)
    away = r > 0.0
    if not away.any():
        return None
    return math.atan2(float((y[away] / r[away]).mean()), float((x[away] / r[away]).mean()))


def azimuth_bins(points: np.ndarray) -> np.ndarray:
    """The occupied bins (of ``AZIMUTH_BINS`` around the sensor) of a cloud, as a mask."""
    mask = np.zeros(AZIMUTH_BINS, bool)
    x = points[:, 0].astype(np.float64)
    y = points[:, 1].astype(np.float64)
    # A point on the sensor's axis has no azimuth.
    away = (x != 0.0) | (y != 0.0)
    azimuth = np.arctan2(y[away], x[away])
    index = np.floor((azimuth + math.pi) / (2.0 * math.pi) * AZIMUTH_BINS).astype(np.int64)
    mask[np.clip(index, 0, AZIMUTH_BINS - 1)] = True
    return mask


class SectorAssembler:
    """Groups sector clouds into revolutions, as a lidar driver publishing sectors sends them.

    With ``sectors_per_revolution`` > 0, a revolution is that many sectors with points; with
    0 (detect), a revolution ends where a sector begins to cover the azimuths it already
    covers, and the count seen then is used from the next revolution on (so that a
    revolution is given out with its last sector, not with the next one's first). Either
    way a sector that overlaps the revolution before it is complete ends it early (a lost
    sector): that one is given out marked incomplete. So does a sector that jumps back
    against the sensor's turn (learnt from the steps between sectors): the next revolution
    of a scan that does not cover all around, whose first sectors may have been lost. A
    revolution begins with the first sector after start or reset, or after such a jump;
    empty sectors are counted and belong to none. A driver that changes its sector count
    needs a reset to be detected again.
    """

    def __init__(self, sectors_per_revolution: int = DETECT) -> None:
        if integer("sectors_per_revolution", sectors_per_revolution) < 0:
            raise ConfigError(
                f"sectors_per_revolution must be >= 0 (0: detect), got {sectors_per_revolution}"
            )
        self.configured = sectors_per_revolution
        self.detected = DETECT
        self.counters = SectorCounters()
        self._reset_revolution()
        self._last_stamp_s = -math.inf
        self._reset_turn()
        # What the revolution given out by count last covered, until the next sector.
        self._counted: np.ndarray | None = None

    def _reset_turn(self) -> None:
        self._centre: float | None = None
        # Steps between sectors that turned counter-clockwise, and clockwise.
        self._turns = [0, 0]

    def _reset_revolution(self) -> None:
        self._points: list[np.ndarray] = []
        self._stamps: list[float] = []
        self._coverage = np.zeros(AZIMUTH_BINS, bool)

    @property
    def sectors_per_revolution(self) -> int:
        """The configured count, else the detected one (0 while detecting)."""
        return self.configured or self.detected

    def reset(self) -> None:
        """Forget the revolution in progress (counted) and what was detected."""
        self.counters.discarded_sectors += len(self._points)
        self._reset_revolution()
        self.detected = DETECT
        self._last_stamp_s = -math.inf
        self._reset_turn()

    def _jumps_back(self, points: np.ndarray) -> bool:
        """Whether this sector turns against the sensor's turn from the one before it.

        Within a revolution most steps go with the turn; a spinning lidar's azimuth goes
        clockwise seen from above, which is assumed until the steps say otherwise.
        """
        centre = azimuth_centre(points)
        if centre is None:
            return False
        previous, self._centre = self._centre, centre
        if previous is None:
            return False
        step = math.remainder(centre - previous, 2.0 * math.pi)
        if step == 0.0:
            return False
        counter_clockwise = self._turns[0] > self._turns[1]
        self._turns[0 if step > 0.0 else 1] += 1
        return (step > 0.0) != counter_clockwise

    def add(self, points: np.ndarray, stamp_s: float) -> list[Revolution]:
        """Take one sector ``[P, 4]``; returns the revolutions it completes (none, or the
        one it cut short, or that and its own when it alone makes one)."""
        if not isinstance(points, np.ndarray) or points.ndim != 2 or points.shape[1] != 4:
            shape = getattr(points, "shape", None)
            raise ShapeError(f"a sector must be [P, 4] (x, y, z, intensity), got {shape}")
        if not (isinstance(stamp_s, (int, float)) and math.isfinite(stamp_s)):
            raise InputValueError(f"sector stamp {stamp_s!r} is not a finite number of seconds")
        if points.size and not np.isfinite(points).all():
            raise InputValueError("a sector holds NaN or Inf values")
        self.counters.sectors += 1
        if stamp_s < self._last_stamp_s:
            # Time went back: the revolution in progress mixes two timelines.
            self.counters.discarded_sectors += len(self._points)
            self._reset_revolution()
        self._last_stamp_s = stamp_s
        if points.shape[0] == 0:
            self.counters.empty_sectors += 1
            return []
        if self.configured == 1:
            # Whole scans: each is its own revolution, and no coverage or turn decides.
            self._points.append(np.ascontiguousarray(points, dtype=np.float32))
            self._stamps.append(float(stamp_s))
            return [self._emit(True)]
        done: list[Revolution] = []
        bins = azimuth_bins(points)
        occupied = int(np.count_nonzero(bins))
        counted, self._counted = self._counted, None
        if counted is not None and np.count_nonzero(bins & counted) <= OVERLAP_SHARE * occupied:
            self.counters.short_revolutions += 1
        overlap = int(np.count_nonzero(bins & self._coverage)) / max(occupied, 1)
        jumped = self._jumps_back(points)
        if self._points and (overlap > OVERLAP_SHARE or jumped):
            # Below a known count (a revolution at the count was given out already): a
            # sector was lost, and what came is given out as incomplete.
            learning = self.sectors_per_revolution == DETECT
            if learning:
                self.detected = len(self._points)
            done.append(self._emit(learning))
        self._points.append(np.ascontiguousarray(points, dtype=np.float32))
        self._stamps.append(float(stamp_s))
        self._coverage |= bins
        if len(self._points) == self.sectors_per_revolution:
            counted = self._coverage.copy()
            done.append(self._emit(True))
            self._counted = counted if self.configured > 1 else None
        return done

    def flush(self) -> Revolution | None:
        """The revolution in progress, given out as it is (end of a stream)."""
        if not self._points:
            return None
        expected = self.sectors_per_revolution
        return self._emit(expected != DETECT and len(self._points) == expected)

    def _emit(self, complete: bool) -> Revolution:
        points = np.concatenate(self._points) if len(self._points) > 1 else self._points[0]
        revolution = Revolution(
            points, self._stamps[-1], self._stamps[0], len(self._points), complete
        )
        self.counters.revolutions += 1
        if not complete:
            self.counters.incomplete_revolutions += 1
        self._reset_revolution()
        return revolution
