"""Rigid transforms as 4x4 matrices, checked quaternions, and a ROS-free transform tree."""

from __future__ import annotations

import bisect
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from dynshape_perception.errors import TransformError

Matrix = np.ndarray
# A quaternion this far from unit length is not a rotation that lost precision: a sender bug.
MIN_QUATERNION_NORM = 1e-6
# Dynamic transforms kept per frame pair (tf2 keeps 10 s; a drive's /tf runs at 50-100 Hz).
DEFAULT_CACHE_S = 10.0


class DegenerateQuaternion(TransformError):
    """A quaternion of (near) zero length or with NaN/Inf: no rotation at all."""


def normalised_quaternion(x: float, y: float, z: float, w: float) -> tuple[float, ...]:
    """``(x, y, z, w)`` scaled to unit length; DegenerateQuaternion for zero or non-finite,
    or one whose length overflows (its components would all round to zero)."""
    q = (float(x), float(y), float(z), float(w))
    if not all(math.isfinite(v) for v in q):
        raise DegenerateQuaternion(f"quaternion {q} holds NaN or Inf")
    norm = math.sqrt(sum(v * v for v in q))
    if not math.isfinite(norm):
        raise DegenerateQuaternion(f"quaternion {q}: its length overflows")
    if norm < MIN_QUATERNION_NORM:
        raise DegenerateQuaternion(f"quaternion {q} has length {norm:.3g}: no rotation")
    return tuple(v / norm for v in q)


def rotation_matrix(q: Sequence[float]) -> np.ndarray:
    """The 3x3 rotation of a unit quaternion ``(x, y, z, w)``."""
    x, y, z, w = (float(v) for v in q)
    return np.array(
        [
            [1 - 2 * (y * y + z * z), 2 * (x * y - z * w), 2 * (x * z + y * w)],
            [2 * (x * y + z * w), 1 - 2 * (x * x + z * z), 2 * (y * z - x * w)],
            [2 * (x * z - y * w), 2 * (y * z + x * w), 1 - 2 * (x * x + y * y)],
        ]
    )


def matrix(
    translation: Sequence[float] | np.ndarray, quaternion: Sequence[float] | np.ndarray
) -> Matrix:
    """The transform of a (translation, quaternion) pair; the quaternion is normalised first."""
    t = [float(v) for v in translation]
    if not all(math.isfinite(v) for v in t):
        raise TransformError(f"translation {t} holds NaN or Inf")
    m = np.eye(4)
    m[:3, :3] = rotation_matrix(normalised_quaternion(*quaternion))
    m[:3, 3] = t
    return m


def planar(x: float = 0.0, y: float = 0.0, yaw: float = 0.0, z: float = 0.0) -> Matrix:
    c, s = math.cos(yaw), math.sin(yaw)
    m = np.eye(4)
    m[:2, :2] = [[c, -s], [s, c]]
    m[:3, 3] = (x, y, z)
    return m


def identity() -> Matrix:
    return np.eye(4)


def quaternion_of(m: Matrix) -> tuple[float, float, float, float]:
    """The unit quaternion ``(x, y, z, w)`` of a transform's rotation (w >= 0)."""
    r = np.asarray(m, dtype=np.float64)[:3, :3]
    trace = float(np.trace(r))
    if trace > 0.0:
        s = 2.0 * math.sqrt(trace + 1.0)
        q = ((r[2, 1] - r[1, 2]) / s, (r[0, 2] - r[2, 0]) / s, (r[1, 0] - r[0, 1]) / s, s / 4)
    else:
        i = int(np.argmax(np.diag(r)))
        j, k = (i + 1) % 3, (i + 2) % 3
        s = 2.0 * math.sqrt(max(1.0 + r[i, i] - r[j, j] - r[k, k], 0.0))
        v = [0.0, 0.0, 0.0]
        v[i] = s / 4
        v[j] = (r[j, i] + r[i, j]) / s
        v[k] = (r[k, i] + r[i, k]) / s
        q = (v[0], v[1], v[2], (r[k, j] - r[j, k]) / s)
    x, y, z, w = normalised_quaternion(*q)
    return (x, y, z, w) if w >= 0.0 else (-x, -y, -z, -w)


def yaw_of(m: Matrix) -> float:
    """Heading of the transform's x axis in the target's xy plane."""
    return math.atan2(float(m[1, 0]), float(m[0, 0]))


def yaw_quaternion(yaw: float) -> tuple[float, float, float, float]:
    return (0.0, 0.0, math.sin(yaw / 2.0), math.cos(yaw / 2.0))


def inverse(m: Matrix) -> Matrix:
    out = np.eye(4)
    r = m[:3, :3]
    out[:3, :3] = r.T
    out[:3, 3] = -r.T @ m[:3, 3]
    return out


def transform_points(m: Matrix, points: np.ndarray) -> np.ndarray:
    """Points ``[P, >=3]`` with their first three columns moved by ``m`` (a new array, same
    dtype; further columns such as intensity are kept)."""
    out = points.copy()
    if points.shape[0] == 0 or np.array_equal(m, np.eye(4)):
        return out
    if _translation_only(m):
        # A mount without rotation (a lidar on a mast): the product's terms other than the
        # point's own coordinate times one are zeros, so adding the translation alone gives
        # the same floats at a fraction of the matrix product's cost, where all are finite.
        column = np.empty(points.shape[0])
        for axis in range(3):
            np.add(points[:, axis], float(m[axis, 3]), out=column, dtype=np.float64)
            if not np.isfinite(column).all():
                break
            out[:, axis] = column
        else:
            return out
    xyz = points[:, :3].astype(np.float64) @ m[:3, :3].T + m[:3, 3]
    out[:, :3] = xyz
    return out


def _translation_only(m: Matrix) -> bool:
    """Whether ``m`` only translates, by finite offsets none of which is -0.0 (where the
    product's +0.0 terms would decide the sign of a zero coordinate)."""
    t = m[:3, 3]
    return bool(
        np.array_equal(m[:3, :3], np.eye(3))
        and np.isfinite(t).all()
        and not (np.signbit(t) & (t == 0.0)).any()
    )


def interpolate(a: Matrix, b: Matrix, w: float) -> Matrix:
    """Linear in translation, spherical in rotation; ``w`` 0 gives ``a``, 1 gives ``b``."""
    qa, qb = np.array(quaternion_of(a)), np.array(quaternion_of(b))
    dot = float(qa @ qb)
    if dot < 0.0:
        qb, dot = -qb, -dot
    if dot > 1.0 - 1e-9:
        q = qa + w * (qb - qa)
    else:
        theta = math.acos(min(dot, 1.0))
        q = (math.sin((1 - w) * theta) * qa + math.sin(w * theta) * qb) / math.sin(theta)
    return matrix(a[:3, 3] + w * (b[:3, 3] - a[:3, 3]), q)


@dataclass
class _Edge:
    """Transforms of ``child`` in ``parent``: one static, or dynamic ones by stamp."""

    parent: str
    static: Matrix | None = None
    stamps: list[float] = field(default_factory=list)
    matrices: list[Matrix] = field(default_factory=list)

    def at(self, stamp_s: float, tolerance_s: float) -> Matrix | None:
        if self.static is not None:
            return self.static
        if not self.stamps:
            return None
        i = bisect.bisect_left(self.stamps, stamp_s)
        if i < len(self.stamps) and self.stamps[i] == stamp_s:
            return self.matrices[i]
        if 0 < i < len(self.stamps):
            t0, t1 = self.stamps[i - 1], self.stamps[i]
            return interpolate(self.matrices[i - 1], self.matrices[i], (stamp_s - t0) / (t1 - t0))
        end = 0 if i == 0 else -1
        if abs(self.stamps[end] - stamp_s) <= tolerance_s:
            return self.matrices[end]
        return None


class TransformTree:
    """What tf2's buffer does for a replay without ROS: a tree of frames, each with one parent.

    Static transforms hold at every stamp; dynamic ones are interpolated between their
    neighbouring stamps, and used beyond the newest or oldest only within ``tolerance_s``.
    """

    def __init__(self, cache_s: float = DEFAULT_CACHE_S, tolerance_s: float = 0.0) -> None:
        self.cache_s = cache_s
        self.tolerance_s = tolerance_s
        self._edges: dict[str, _Edge] = {}

    def frames(self) -> set[str]:
        return set(self._edges) | {e.parent for e in self._edges.values()}

    def set(self, parent: str, child: str, stamp_s: float, m: Matrix, static: bool) -> None:
        """Add one transform of ``child`` in ``parent`` (a frame has one parent; the newest
        one given wins, as in tf2)."""
        if not parent or not child or parent == child:
            raise TransformError(f"a transform links two frames, got {parent!r} and {child!r}")
        edge = self._edges.get(child)
        if edge is None or edge.parent != parent:
            edge = self._edges[child] = _Edge(parent)
        if static:
            edge.static = np.array(m, dtype=np.float64)
            return
        i = bisect.bisect_left(edge.stamps, stamp_s)
        if i < len(edge.stamps) and edge.stamps[i] == stamp_s:
            edge.matrices[i] = np.array(m, dtype=np.float64)
        else:
            edge.stamps.insert(i, stamp_s)
            edge.matrices.insert(i, np.array(m, dtype=np.float64))
        cut = bisect.bisect_left(edge.stamps, edge.stamps[-1] - self.cache_s)
        del edge.stamps[:cut], edge.matrices[:cut]

    def _chain(self, frame: str) -> list[str]:
        chain = [frame]
        while chain[-1] in self._edges:
            parent = self._edges[chain[-1]].parent
            if parent in chain:
                raise TransformError(f"the transforms of {frame!r} form a loop")
            chain.append(parent)
        return chain

    def _to_ancestor(self, frame: str, ancestor: str, stamp_s: float) -> Matrix:
        m = np.eye(4)
        while frame != ancestor:
            edge = self._edges[frame]
            step = edge.at(stamp_s, self.tolerance_s)
            if step is None:
                raise TransformError(
                    f"no transform of {frame!r} in {edge.parent!r} at {stamp_s:.6f} s"
                )
            m = step @ m
            frame = edge.parent
        return m

    def lookup(self, target: str, source: str, stamp_s: float) -> Matrix:
        """The transform taking points of ``source`` into ``target`` at ``stamp_s``."""
        if target == source:
            return np.eye(4)
        up_source, up_target = self._chain(source), self._chain(target)
        common = next((f for f in up_source if f in up_target), None)
        if common is None:
            raise TransformError(f"frames {source!r} and {target!r} are not connected")
        up: Matrix = inverse(self._to_ancestor(target, common, stamp_s))
        down: Matrix = self._to_ancestor(source, common, stamp_s)
        chained: Matrix = up @ down
        return chained

    def latest(self, target: str, source: str) -> tuple[Matrix, float]:
        """The transform at the newest stamp every dynamic link between the frames has."""
        if not self.connected(target, source):
            raise TransformError(f"frames {source!r} and {target!r} are not connected")
        up_source, up_target = self._chain(source), self._chain(target)
        common = next(f for f in up_source if f in up_target)
        links = [*up_source[: up_source.index(common)], *up_target[: up_target.index(common)]]
        newest = [self._edges[f].stamps[-1] for f in links if self._edges[f].static is None]
        stamp_s = min(newest, default=0.0)
        return self.lookup(target, source, stamp_s), stamp_s

    def connected(self, target: str, source: str) -> bool:
        """Whether the two frames share an ancestor (at some stamp)."""
        if target == source:
            return target in self.frames()
        try:
            return bool(set(self._chain(source)) & set(self._chain(target)))
        except TransformError:
            return False

    def can_transform(self, target: str, source: str, stamp_s: float) -> bool:
        try:
            self.lookup(target, source, stamp_s)
        except TransformError:
            return False
        return True
