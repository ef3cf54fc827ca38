"""Tracking scores by TrackEval (HOTA, CLEAR, Identity), box scores by BEV IoU; by class, range."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import cv2
import numpy as np
from scipy.optimize import linear_sum_assignment

from dynshape_perception.errors import ConfigError, DataError
from dynshape_perception.perception.records import LABEL_CAR, LABEL_PEDESTRIAN
from dynshape_perception.tools.sim.traffic import CAR, CLASSES, PEDESTRIAN

RANGE_BANDS_M = ((0.0, 20.0), (20.0, 40.0), (40.0, 70.0))
# Similarity of a track to a truth: 1 - d / MATCH_SCALE_M (d the centres' ground distance):
# CLEAR and Identity match at similarity 0.5, so within 1 m; HOTA sweeps 0.05 to 0.95.
MATCH_SCALE_M = 2.0
MATCH_THRESHOLD = 0.5
IOU_THRESHOLDS = (0.1, 0.5)
# Table label of a track -> the class it claims (none: it counts in no class's false positives).
CLASS_OF_LABEL = {LABEL_CAR: CAR, LABEL_PEDESTRIAN: PEDESTRIAN}
NO_CLASS = -1


@dataclass(frozen=True)
class Boxes:
    """Boxes of one frame: ids, class, ground-plane centre ``[n, 2]``, size and heading,
    range from the sensor, and (truth only) whether each is scored or only tolerated."""

    ids: np.ndarray
    cls: np.ndarray
    xy: np.ndarray
    length: np.ndarray
    width: np.ndarray
    yaw: np.ndarray
    range_m: np.ndarray
    scored: np.ndarray

    def __post_init__(self) -> None:
        n = self.ids.shape[0]
        for name in ("cls", "length", "width", "yaw", "range_m", "scored"):
            if getattr(self, name).shape != (n,):
                raise DataError(f"boxes disagree: {n} ids, {name} {getattr(self, name).shape}")
        if self.xy.shape != (n, 2) or not np.isfinite(self.xy).all():
            raise DataError(f"box centres must be finite [{n}, 2], got {self.xy.shape}")

    def __len__(self) -> int:
        return int(self.ids.shape[0])

    def take(self, keep: np.ndarray) -> Boxes:
        return Boxes(*(getattr(self, f)[keep] for f in Boxes.__dataclass_fields__))


@dataclass(frozen=True)
class ScoredFrame:
    truth: Boxes
    output: Boxes


def class_of_labels(labels: np.ndarray) -> np.ndarray:
    return np.array([CLASS_OF_LABEL.get(int(v), NO_CLASS) for v in labels], dtype=np.int64)


def similarity(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``[len(a), len(b)]`` similarity of ground-plane centres, in [0, 1]."""
    d = np.hypot(a[:, None, 0] - b[None, :, 0], a[:, None, 1] - b[None, :, 1])
    return np.clip(1.0 - d / MATCH_SCALE_M, 0.0, 1.0)


def _match(score: np.ndarray, threshold: float) -> tuple[np.ndarray, np.ndarray]:
    if score.size == 0:
        return np.zeros(0, np.intp), np.zeros(0, np.intp)
    rows, cols = linear_sum_assignment(-score)
    keep = score[rows, cols] >= threshold
    return rows[keep], cols[keep]


def _subset(frame: ScoredFrame, truth_in: np.ndarray, output_in: np.ndarray) -> tuple[Boxes, Boxes]:
    """The truth scored in a subset and the outputs that belong to it.

    As TrackEval's benchmarks treat distractors: an output matched to a truth outside the
    subset (or to one only tolerated: hidden, out of view) is removed, not counted false;
    an unmatched output stays where its own class or range puts it.
    """
    truth, out = frame.truth, frame.output
    rows, cols = _match(similarity(truth.xy, out.xy), MATCH_THRESHOLD)
    keep_truth = truth.scored & truth_in
    keep_out = output_in.copy()
    keep_out[cols] = keep_truth[rows]
    return truth.take(keep_truth), out.take(keep_out)


def _trackeval_data(pairs: Sequence[tuple[Boxes, Boxes]]) -> dict[str, Any]:
    """One sequence in the layout TrackEval's metrics take (ids renumbered from 0)."""
    gt_map: dict[int, int] = {}
    trk_map: dict[int, int] = {}
    data: dict[str, Any] = {"gt_ids": [], "tracker_ids": [], "similarity_scores": []}
    for truth, out in pairs:
        data["gt_ids"].append(
            np.array([gt_map.setdefault(int(i), len(gt_map)) for i in truth.ids], dtype=int)
        )
        data["tracker_ids"].append(
            np.array([trk_map.setdefault(int(i), len(trk_map)) for i in out.ids], dtype=int)
        )
        data["similarity_scores"].append(similarity(truth.xy, out.xy))
    data["num_timesteps"] = len(pairs)
    data["num_gt_ids"], data["num_tracker_ids"] = len(gt_map), len(trk_map)
    data["num_gt_dets"] = sum(len(t) for t, _ in pairs)
    data["num_tracker_dets"] = sum(len(o) for _, o in pairs)
    return data


def _metrics() -> tuple[Any, Any, Any]:
    try:
        from trackeval.metrics import CLEAR, HOTA, Identity
    except ImportError as err:
        raise ConfigError(f"tracking scores need TrackEval (requirements-eval.txt): {err}") from err
    config = {"THRESHOLD": MATCH_THRESHOLD, "PRINT_CONFIG": False}
    return HOTA(), CLEAR(config), Identity(config)


def _row(sequences: Sequence[Sequence[tuple[Boxes, Boxes]]]) -> dict[str, Any]:
    hota, clear, identity = _metrics()
    results: dict[str, dict[str, Any]] = {"hota": {}, "clear": {}, "identity": {}}
    gt_dets = 0
    for s, pairs in enumerate(sequences):
        data = _trackeval_data(pairs)
        gt_dets += data["num_gt_dets"]
        for name, metric in (("hota", hota), ("clear", clear), ("identity", identity)):
            results[name][str(s)] = metric.eval_sequence(data)
    if gt_dets == 0:
        return {"truth_boxes": 0}
    h = hota.combine_sequences(results["hota"])
    c = clear.combine_sequences(results["clear"])
    i = identity.combine_sequences(results["identity"])
    return {
        "truth_boxes": gt_dets,
        "truth_tracks": sum(len({int(x) for t, _ in pairs for x in t.ids}) for pairs in sequences),
        "MOTA": float(c["MOTA"]),
        "IDF1": float(i["IDF1"]),
        "HOTA": float(np.mean(h["HOTA"])),
        "DetA": float(np.mean(h["DetA"])),
        "AssA": float(np.mean(h["AssA"])),
        "MOTP": float(c["MOTP"]),
        "IDSW": int(c["IDSW"]),
        "FP": int(c["CLR_FP"]),
        "FN": int(c["CLR_FN"]),
        "MT": int(c["MT"]),
        "ML": int(c["ML"]),
    }


Selector = Callable[[Boxes], np.ndarray]


def _band(lo: float, hi: float) -> Selector:
    return lambda b: (b.range_m >= lo) & (b.range_m < hi)


def _of_class(c: int) -> Selector:
    return lambda b: b.cls == c


def _subsets() -> dict[str, tuple[Selector, Selector]]:
    """Named subsets: how a truth is chosen, and how an unmatched output is."""
    every: Selector = lambda b: np.ones(len(b), dtype=bool)  # noqa: E731
    out: dict[str, tuple[Selector, Selector]] = {"all": (every, every)}
    for c, name in enumerate(CLASSES):
        out[name] = (_of_class(c), _of_class(c))
    for lo, hi in RANGE_BANDS_M:
        out[f"{lo:g}-{hi:g} m"] = (_band(lo, hi), _band(lo, hi))
    return out


def score_tracking(scenes: Sequence[Sequence[ScoredFrame]]) -> dict[str, dict[str, Any]]:
    """HOTA, MOTA, IDF1 and their parts, overall, by class and by range band, over scenes."""
    if not scenes or not any(scenes):
        raise DataError("no frames to score")
    rows = {}
    for name, (pick_truth, pick_out) in _subsets().items():
        sequences = [
            [_subset(f, pick_truth(f.truth), pick_out(f.output)) for f in frames]
            for frames in scenes
        ]
        rows[name] = _row(sequences)
    return rows


def _corners(b: Boxes, k: int) -> tuple[tuple[float, float], tuple[float, float], float]:
    return (
        (float(b.xy[k, 0]), float(b.xy[k, 1])),
        (float(b.length[k]), float(b.width[k])),
        math.degrees(float(b.yaw[k])),
    )


def bev_iou(a: Boxes, b: Boxes) -> np.ndarray:
    """``[len(a), len(b)]`` bird's-eye-view IoU of oriented boxes (OpenCV's polygon clip)."""
    out = np.zeros((len(a), len(b)))
    near = similarity(a.xy, b.xy) > 0.0
    reach = 0.5 * (np.hypot(a.length, a.width)[:, None] + np.hypot(b.length, b.width)[None, :])
    d = np.hypot(a.xy[:, None, 0] - b.xy[None, :, 0], a.xy[:, None, 1] - b.xy[None, :, 1])
    for i, j in zip(*np.nonzero(near | (d < reach)), strict=True):
        ra, rb = _corners(a, int(i)), _corners(b, int(j))
        kind, polygon = cv2.rotatedRectangleIntersection(ra, rb)
        if kind == cv2.INTERSECT_NONE or polygon is None:
            continue
        inter = float(cv2.contourArea(polygon))
        union = a.length[i] * a.width[i] + b.length[j] * b.width[j] - inter
        out[i, j] = inter / union if union > 0 else 0.0
    return out


def score_detection(scenes: Sequence[Sequence[ScoredFrame]]) -> dict[str, dict[str, Any]]:
    """Box recall at BEV IoU thresholds and the mean IoU of matched boxes, by class and range.

    Each frame's scored truth is matched one to one to the boxes (Hungarian on IoU); a box
    that overlaps no truth, scored or tolerated, is false, where its own range puts it.
    """
    if not scenes or not any(scenes):
        raise DataError("no frames to score")
    subsets = _subsets()
    truth = dict.fromkeys(subsets, 0)
    false = dict.fromkeys(subsets, 0)
    best_ious: dict[str, list[float]] = {name: [] for name in subsets}
    for frames in scenes:
        for f in frames:
            iou = bev_iou(f.truth, f.output)
            scored = iou[f.truth.scored]
            rows, cols = _match(scored, 1e-9)
            best = np.zeros(int(f.truth.scored.sum()))
            best[rows] = scored[rows, cols]
            overlaps = (iou > 0.0).any(axis=0) if len(f.truth) else np.zeros(len(f.output), bool)
            for name, (pick_truth, pick_out) in subsets.items():
                truth_in = pick_truth(f.truth)[f.truth.scored]
                truth[name] += int(truth_in.sum())
                best_ious[name].extend(best[truth_in].tolist())
                false[name] += int((pick_out(f.output) & ~overlaps).sum())
    rows_out: dict[str, dict[str, Any]] = {}
    for name in subsets:
        ious = np.asarray(best_ious[name])
        row: dict[str, Any] = {"truth_boxes": truth[name], "false_boxes": false[name]}
        if ious.size:
            for t in IOU_THRESHOLDS:
                row[f"recall@{t:g}"] = float((ious >= t).mean())
            matched = ious[ious > 0.0]
            row["mean_bev_iou"] = float(matched.mean()) if matched.size else 0.0
        rows_out[name] = row
    return rows_out


def table_lines(rows: dict[str, dict[str, Any]], columns: Sequence[str]) -> list[str]:
    """A Markdown table of ``rows`` with ``columns`` (a missing value: a dash)."""
    lines = ["| subset | " + " | ".join(columns) + " |", "| --- |" + " ---: |" * len(columns)]
    for name, row in rows.items():
        cells = []
        for col in columns:
            value = row.get(col)
            if value is None:
                cells.append("–")
            elif isinstance(value, float):
                cells.append(f"{value:.3f}")
            else:
                cells.append(str(value))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return lines


TRACKING_COLUMNS = (
    "truth_tracks",
    "truth_boxes",
    "HOTA",
    "DetA",
    "AssA",
    "MOTA",
    "IDF1",
    "IDSW",
    "FP",
    "FN",
    "MOTP",
)
DETECTION_COLUMNS = ("truth_boxes", "recall@0.1", "recall@0.5", "mean_bev_iou", "false_boxes")
