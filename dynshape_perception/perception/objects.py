"""What the standard object messages add to the tables: UUIDs, covariances, existence."""

from __future__ import annotations

import uuid
from dataclasses import dataclass

import numpy as np

from dynshape_perception.errors import MessageError
from dynshape_perception.paramspec import check_fields, param

UUID_BYTES = 16
# Row-major 6x6 covariance of (x, y, z, roll, pitch, yaw), as geometry_msgs carries it.
COVARIANCE_SIZE = 36
_X, _Y, _Z, _ROLL, _PITCH, _YAW = (i * 7 for i in range(6))
# A deterministic namespace for replays; live nodes draw a random one per process.
REPLAY_NAMESPACE = uuid.uuid5(uuid.NAMESPACE_URL, "dynshape_perception/replay")


# Standard deviations and speeds: above 0, and no wider than a street.
MIN_STD = 1e-6
MAX_STD = 100.0


@dataclass(frozen=True)
class ObjectParams:
    """Uncertainty of the published objects (standard deviations; they grow with each frame
    a track coasts without a detection) and the speed below which a track is stationary."""

    position_std_m: float = param(
        0.3,
        "standard deviation of a track's position (x, y) in the published covariance; it grows "
        "with each frame the track coasts without a detection",
        low=MIN_STD,
        high=MAX_STD,
    )
    height_std_m: float = param(
        0.3,
        "standard deviation of a track's height (z) in the published covariance; it grows "
        "with each frame the track coasts without a detection",
        low=MIN_STD,
        high=MAX_STD,
    )
    yaw_std_rad: float = param(
        0.2,
        "standard deviation of a track's heading in the published covariance; it grows "
        "with each frame the track coasts without a detection",
        low=MIN_STD,
        high=MAX_STD,
    )
    velocity_std_mps: float = param(
        1.0,
        "standard deviation of a track's velocity (x, y) in the published covariance; it grows "
        "with each frame the track coasts without a detection",
        low=MIN_STD,
        high=MAX_STD,
    )
    stationary_speed_mps: float = param(
        0.3, "tracks slower than this are published as stationary", low=MIN_STD, high=MAX_STD
    )

    def __post_init__(self) -> None:
        check_fields(self)


def existence_probability(hits: np.ndarray, missed: np.ndarray, max_missed: int) -> np.ndarray:
    """float32 in (0, 1): more detections raise it, each frame missed lowers it towards 0.

    ``hits / (hits + 1)`` is the share of frames a track would keep if the next one missed;
    the missed frames scale it down linearly to the tracker's ``max_missed_frames``.
    """
    hits = np.asarray(hits, dtype=np.float64)
    missed = np.asarray(missed, dtype=np.float64)
    seen = hits / (hits + 1.0)
    fading = 1.0 - missed / (max(int(max_missed), 0) + 1.0)
    return np.clip(seen * fading, 0.0, 1.0).astype(np.float32)


def pose_covariance(missed: np.ndarray, params: ObjectParams) -> np.ndarray:
    """``[n, 36]`` float64 pose covariances; roll and pitch are not estimated (0)."""
    grow = (1.0 + np.asarray(missed, dtype=np.float64)) ** 2
    out = np.zeros((grow.size, COVARIANCE_SIZE))
    out[:, _X] = out[:, _Y] = params.position_std_m**2 * grow
    out[:, _Z] = params.height_std_m**2
    out[:, _YAW] = params.yaw_std_rad**2 * grow
    return out


def twist_covariance(missed: np.ndarray, params: ObjectParams) -> np.ndarray:
    """``[n, 36]`` float64 twist covariances: linear x and y only."""
    grow = (1.0 + np.asarray(missed, dtype=np.float64)) ** 2
    out = np.zeros((grow.size, COVARIANCE_SIZE))
    out[:, _X] = out[:, _Y] = params.velocity_std_mps**2 * grow
    return out


class TrackUuids:
    """A UUID per track id, the same for the track's whole life and never given again.

    Ids restart when the tracker does (a frame change, a time jump), so each restart opens
    a new generation; the namespace separates runs (random per live process, fixed in
    replays so that their outputs are reproducible).
    """

    def __init__(self, namespace: uuid.UUID | None = None) -> None:
        self.namespace = namespace or uuid.uuid4()
        self.generation = 0
        # The UUIDs of the ids asked for last: a hash each is the cost, and tracks live long.
        self._last: dict[int, bytes] = {}

    def reset(self) -> None:
        self.generation += 1
        self._last = {}

    def of(self, ids: np.ndarray) -> np.ndarray:
        """``[n, 16]`` uint8 UUIDs of track ids."""
        keys = [int(i) for i in np.asarray(ids).tolist()]
        last = self._last
        self._last = {
            key: last.get(key) or uuid.uuid5(self.namespace, f"{self.generation}/{key}").bytes
            for key in keys
        }
        raw = bytearray().join([self._last[key] for key in keys])
        return np.frombuffer(raw, np.uint8).reshape(-1, UUID_BYTES)


def _uuid_keys(uuids: np.ndarray) -> list[bytes]:
    """Each row's UUID bytes. Rows of a ``[N, 16]`` byte array are sliced from its bytes:
    a message's tracks come so, at every input."""
    if isinstance(uuids, np.ndarray) and uuids.ndim == 2 and uuids.shape[1] == UUID_BYTES:
        raw = np.ascontiguousarray(uuids, dtype=np.uint8).tobytes()
        return [raw[i : i + UUID_BYTES] for i in range(0, len(raw), UUID_BYTES)]
    keys = [bytes(np.asarray(u, dtype=np.uint8)) for u in uuids]
    if any(len(k) != UUID_BYTES for k in keys):
        raise MessageError(f"a UUID must have {UUID_BYTES} bytes")
    return keys


class UuidIndex:
    """Small integer ids for the UUIDs of received tracks (the predictor's histories are
    keyed by integers); an id is forgotten once its UUID is no longer received."""

    def __init__(self) -> None:
        self._ids: dict[bytes, int] = {}
        self._uuids: dict[int, bytes] = {}
        self._next = 1
        # UUIDs repeated in the last message.
        self.repeated = 0

    def reset(self) -> None:
        self._ids.clear()
        self._uuids.clear()

    def update(self, uuids: np.ndarray) -> np.ndarray:
        """uint32 ids of this message's UUIDs; ids of UUIDs no longer present are dropped.

        A UUID repeated in one message is told apart by its occurrence (the second is
        another object, with an id of its own) and counted in ``repeated``.
        """
        keys = _uuid_keys(uuids)
        present = set(keys)
        self.repeated = len(keys) - len(present)
        if self.repeated:
            seen: dict[bytes, int] = {}
            for i, key in enumerate(keys):
                n = seen[key] = seen.get(key, 0) + 1
                if n > 1:
                    keys[i] = key + n.to_bytes(4, "little")
            present = set(keys)
        ids = self._ids
        for gone in ids.keys() - present:
            del self._uuids[ids.pop(gone)]
        # Most messages bring no new UUID: the loop that hands out ids, in message order,
        # runs only for those that do.
        if not ids.keys() >= present:
            for key in keys:
                if key not in ids:
                    ids[key] = self._next
                    self._uuids[self._next] = key[:UUID_BYTES]
                    self._next += 1
        return np.fromiter(map(ids.__getitem__, keys), np.uint32, len(keys))

    def uuids(self, ids: np.ndarray) -> np.ndarray:
        out = np.zeros((len(ids), UUID_BYTES), dtype=np.uint8)
        for i, track_id in enumerate(np.asarray(ids).tolist()):
            out[i] = np.frombuffer(self._uuids[int(track_id)], dtype=np.uint8)
        return out
