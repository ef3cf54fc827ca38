"""Readers of the public datasets: KITTI Velodyne scans and ETH/UCY pedestrian annotations."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from dynshape_perception.errors import DataError

# Track id -> (frame numbers [n], positions [n, 2]).

_LOG = logging.getLogger(__name__)

KITTI_FIELDS = 4
KITTI_POINT_BYTES = KITTI_FIELDS * 4
ETH_UCY_FIELDS = 4
ETH_UCY_STEP_S = 0.4
# Frames and ids are written as "780" or "1.0"; anything further from an integer is a defect.
_INTEGRAL_TOLERANCE = 1.0e-6
# Frames and ids are non-negative indices; beyond 2**53 a float64 no longer holds every integer.
_MAX_INDEX = 2**53


def read_kitti_bin(path: str | Path, allow_empty: bool = True) -> np.ndarray:
    """One KITTI Velodyne scan as float32 ``[P, 4]``: x, y, z (metres), reflectance.

    Without ``allow_empty``, a file of no points is a DataError naming it: a tool run on
    it would report figures of nothing.
    """
    path = Path(path)
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise DataError(f"cannot read KITTI scan {path}: {err}") from err
    if not raw and not allow_empty:
        raise DataError(f"KITTI scan {path} is empty: it holds no points")
    if len(raw) % KITTI_POINT_BYTES:
        raise DataError(
            f"KITTI scan {path} has {len(raw)} bytes, not a multiple of "
            f"{KITTI_POINT_BYTES} bytes a point (truncated or not a .bin scan)"
        )
    points = np.frombuffer(raw, dtype="<f4").reshape(-1, KITTI_FIELDS)
    return np.ascontiguousarray(points, dtype=np.float32)


@dataclass(frozen=True)
class EthUcyScene:
    """The parsed rows of one ETH/UCY file: float64 ``[R, 4]`` frame, ped_id, x, y (metres).

    Frames and ids are stored already rounded to integers (``_parse_row``).
    """

    path: Path
    rows: np.ndarray
    skipped_rows: int

    @property
    def frames(self) -> np.ndarray:
        return self.rows[:, 0].astype(np.int64)

    @property
    def ped_ids(self) -> np.ndarray:
        return self.rows[:, 1].astype(np.int64)

    def require_rows(self) -> EthUcyScene:
        """This scene, or a DataError naming the file when no row of it could be read."""
        if self.rows.shape[0] == 0:
            raise DataError(
                f"ETH/UCY file {self.path} holds no 'frame ped_id x y' row of four numbers "
                f"({self.skipped_rows} malformed row(s) skipped)"
            )
        return self

    def tracks(self) -> dict[int, tuple[np.ndarray, np.ndarray]]:
        """Each pedestrian's ``(frames [n] int64, xy [n, 2] float64)``, sorted by frame."""
        if self.rows.shape[0] == 0:
            return {}
        frames, ids = self.frames, self.ped_ids
        order = np.lexsort((frames, ids))
        sorted_ids = ids[order]
        starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
        groups = np.split(order, starts[1:])
        return {
            int(sorted_ids[start]): (frames[group], self.rows[group, 2:4].copy())
            for start, group in zip(starts, groups, strict=True)
        }


def _parse_row(fields: list[str]) -> tuple[float, float, float, float] | None:
    if len(fields) != ETH_UCY_FIELDS:
        return None
    try:
        frame, ped_id, x, y = (float(field) for field in fields)
    except ValueError:
        return None
    if not all(np.isfinite((frame, ped_id, x, y))):
        return None
    index = (float(np.rint(frame)), float(np.rint(ped_id)))
    for value, whole in zip((frame, ped_id), index, strict=True):
        if abs(value - whole) > _INTEGRAL_TOLERANCE or not 0 <= whole < _MAX_INDEX:
            return None
    return index[0], index[1], x, y


def read_eth_ucy(path: str | Path) -> EthUcyScene:
    """Parse a ``frame ped_id x y`` file; malformed rows are skipped, counted and warned about once.

    A row is malformed when it does not hold exactly four numbers, holds NaN or Inf, its
    frame or pedestrian id is not an integer in [0, 2**53), or it repeats the frame and
    pedestrian id of an earlier row (the first is kept). Blank lines are ignored.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise DataError(f"cannot read ETH/UCY file {path}: {err}") from err
    lines = [line.split() for line in text.splitlines()]
    lines = [fields for fields in lines if fields]
    parsed = [_parse_row(fields) for fields in lines]
    good: list[tuple[float, float, float, float]] = []
    seen: set[tuple[float, float]] = set()
    duplicates = 0
    for row in parsed:
        if row is None:
            continue
        if row[:2] in seen:
            duplicates += 1
            continue
        seen.add(row[:2])
        good.append(row)
    skipped = len(parsed) - len(good)
    if skipped:
        repeated = f" ({duplicates} repeat an earlier frame and ped_id)" if duplicates else ""
        _LOG.warning(
            "%s: skipped %d malformed row(s) of %d%s", path, skipped, len(parsed), repeated
        )
    rows = np.array(good, dtype=np.float64).reshape(-1, ETH_UCY_FIELDS)
    return EthUcyScene(path=path, rows=rows, skipped_rows=skipped)
