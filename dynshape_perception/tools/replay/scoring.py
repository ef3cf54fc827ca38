"""Prediction error against a bag's ground truth: min-over-K displacement, unpredicted agents."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import linear_sum_assignment

DEFAULT_MATCH_RADIUS_M = 2.0
DEFAULT_UNPREDICTED_PENALTY_M = 2.0
# Ground truth is stamped like the frame it belongs to; allow for rounding in other tools.
STAMP_TOLERANCE_NS = 5_000_000


class TruthIndex:
    """Ground-truth tables by stamp, and every true object's path over time."""

    def __init__(self, tables: list[tuple[int, np.ndarray]]) -> None:
        tables = sorted(tables, key=lambda item: item[0])
        self.stamps_ns = np.array([ns for ns, _ in tables], dtype=np.int64)
        self.tables = [table for _, table in tables]
        samples: dict[int, list[tuple[float, float, float]]] = {}
        for ns, table in tables:
            for row in table:
                samples.setdefault(int(row["id"]), []).append(
                    (ns * 1e-9, float(row["x"]), float(row["y"]))
                )
        self._paths = {gid: np.asarray(rows, dtype=np.float64) for gid, rows in samples.items()}

    def __len__(self) -> int:
        return len(self.tables)

    def at(self, stamp_ns: int) -> np.ndarray | None:
        if not self.tables:
            return None
        i = int(np.argmin(np.abs(self.stamps_ns - stamp_ns)))
        if abs(int(self.stamps_ns[i]) - stamp_ns) > STAMP_TOLERANCE_NS:
            return None
        return self.tables[i]

    def future(self, gid: int, t_s: float, offsets_s: np.ndarray) -> np.ndarray:
        """Positions ``[H, 2]`` at ``t_s + offsets_s``, interpolated; NaN outside the path."""
        path = self._paths.get(gid)
        out = np.full((offsets_s.size, 2), np.nan)
        if path is None or path.shape[0] == 0:
            return out
        times = t_s + offsets_s
        inside = (times >= path[0, 0]) & (times <= path[-1, 0])
        if path.shape[0] == 1:
            out[inside] = path[0, 1:]
            return out
        out[inside, 0] = np.interp(times[inside], path[:, 0], path[:, 1])
        out[inside, 1] = np.interp(times[inside], path[:, 0], path[:, 2])
        return out


@dataclass
class PredictionScore:
    """Accumulates, per frame, each visible true agent's error: the min-over-K average
    displacement of the prediction of the track matched to it, over the steps the truth
    covers, or ``penalty_m`` when no prediction matched it."""

    step_s: float
    match_radius_m: float = DEFAULT_MATCH_RADIUS_M
    penalty_m: float = DEFAULT_UNPREDICTED_PENALTY_M
    matched: int = 0
    unpredicted: int = 0
    error_sum_m: float = 0.0

    def add(
        self,
        truth: TruthIndex,
        stamp_ns: int,
        tracks: np.ndarray,
        predictions: np.ndarray,
        reference_s: float | None = None,
    ) -> tuple[int, int, float]:
        """Score one frame; returns (matched, unpredicted, summed min-ADE in m).

        ``reference_s``: the time the predicted paths start from (a step before their first
        point); the frame's stamp when None.
        """
        table = truth.at(stamp_ns)
        if table is None:
            return 0, 0, 0.0
        t_s = stamp_ns * 1e-9 if reference_s is None else reference_s
        horizon = int(predictions["step"].max()) + 1 if predictions.size else 1
        offsets = self.step_s * np.arange(1, horizon + 1, dtype=np.float64)
        visible = table[table["num_points"] > 0]
        futures = [truth.future(int(gid), t_s, offsets) for gid in visible["id"]]
        keep = [i for i, f in enumerate(futures) if np.isfinite(f[0, 0])]
        visible = visible[keep]
        futures = [futures[i] for i in keep]
        if visible.size == 0:
            return 0, 0, 0.0
        ids = np.unique(predictions["id"])
        rows = tracks[np.isin(tracks["id"], ids)]
        errors: list[float] = []
        if rows.size:
            dist = np.hypot(
                rows["x"][:, None].astype(np.float64) - visible["x"][None, :],
                rows["y"][:, None].astype(np.float64) - visible["y"][None, :],
            )
            cost = np.where(dist <= self.match_radius_m, dist, 1e9)
            r_idx, c_idx = linear_sum_assignment(cost)
            for r, c in zip(r_idx, c_idx, strict=True):
                if cost[r, c] >= 1e9:
                    continue
                mine = predictions[predictions["id"] == rows["id"][r]]
                k_n = int(mine["k"].max()) + 1
                traj = np.full((k_n, horizon, 2), np.nan)
                traj[mine["k"], mine["step"], 0] = mine["x"]
                traj[mine["k"], mine["step"], 1] = mine["y"]
                gap = np.linalg.norm(traj - futures[c][None], axis=-1)
                errors.append(float(np.nanmin(np.nanmean(gap, axis=1))))
        unpredicted = int(visible.size - len(errors))
        self.matched += len(errors)
        self.unpredicted += unpredicted
        self.error_sum_m += float(sum(errors))
        return len(errors), unpredicted, float(sum(errors))

    def summary(self) -> dict[str, float | int | None]:
        scored = self.matched + self.unpredicted
        return {
            "matched": self.matched,
            "unpredicted": self.unpredicted,
            "min_ade_m": round(self.error_sum_m / self.matched, 4) if self.matched else None,
            "coverage": round(self.matched / scored, 4) if scored else None,
            "penalty_m": self.penalty_m,
            "error_m": (
                round((self.error_sum_m + self.penalty_m * self.unpredicted) / scored, 4)
                if scored
                else None
            ),
        }
