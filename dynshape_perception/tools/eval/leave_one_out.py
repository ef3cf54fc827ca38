"""Leave one scene out: fit the predictor on the other real scenes plus generated data, score it."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dynshape_perception.errors import ConfigError, DataError
from dynshape_perception.io.datasets import read_eth_ucy
from dynshape_perception.tools.eval.prediction import (
    OBS_STEPS,
    PRED_STEPS,
    RATIOS,
    extract_windows,
)

# (weights, scene file) -> the report of ``evaluate_prediction`` on it.
Scorer = Callable[[Mapping[str, np.ndarray], Path], dict[str, Any]]
# (training scenes name -> file) -> (weights, fit statistics).
Fitter = Callable[[Mapping[str, Path]], tuple[dict[str, np.ndarray], dict[str, float]]]


@dataclass(frozen=True)
class Scene:
    name: str
    path: Path
    sha256: str


def check_scenes(paths: Sequence[Path]) -> list[Scene]:
    """The scenes to leave out in turn: at least two distinct, readable, each with a window.

    Each is read and checked before any fit starts, so that a bad file costs seconds, not
    the minutes of the fits before it.
    """
    from dynshape_perception.tools.fit.data import file_sha256

    if len(paths) < 2:
        raise ConfigError(
            f"--leave-one-out needs two or more --eth-ucy scenes (one to fit on), got {len(paths)}"
        )
    scenes: list[Scene] = []
    for path in paths:
        scene = read_eth_ucy(path)
        if extract_windows(scene.tracks())[0].shape[0] == 0:
            raise DataError(
                f"{path}: no window of {OBS_STEPS + PRED_STEPS} consecutive annotated frames"
            )
        digest = file_sha256(path)
        for other in scenes:
            if other.sha256 == digest:
                raise ConfigError(
                    f"{path} holds the same bytes as {other.path}: a scene left out would "
                    "be fitted on"
                )
        name = path.stem
        taken = {other.name for other in scenes}
        suffix = 2
        while name in taken:
            name, suffix = f"{path.stem}_{suffix}", suffix + 1
        scenes.append(Scene(name, path, digest))
    return scenes


def leave_one_out(scenes: Sequence[Scene], fit: Fitter, score: Scorer) -> list[dict[str, Any]]:
    """For each scene: weights fitted without it, and its report on them."""
    rows = []
    for held in scenes:
        others = {scene.name: scene.path for scene in scenes if scene is not held}
        started = time.perf_counter()
        weights, stats = fit(others)
        fit_s = time.perf_counter() - started
        result = score(weights, held.path)
        rows.append(
            {
                "scene": held.name,
                "file": str(held.path),
                "sha256": held.sha256,
                "fitted_on": [*sorted(others), "synthetic"],
                "fit_s": round(fit_s, 1),
                "fit_stats": stats,
                **result,
            }
        )
    return rows


def summary_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The leave-one-out table: per scene, each metric and ratio with its 95 % interval."""
    lines = [
        "leave-one-out: each scene scored by weights fitted on the other real scenes and "
        "generated data",
    ]
    for row in rows:
        lines.append("")
        lines.append(
            f"{row['scene']}: fitted on {' + '.join(row['fitted_on'])} in {row['fit_s']:.0f} s"
        )
        lines += scene_lines(row)
    return lines


def scene_lines(result: Mapping[str, Any]) -> list[str]:
    """One scene's report as a table: each metric and ratio with its 95 % interval."""
    ci = result["ci95"]
    lines = [
        f"{result['windows']} windows of {result['pedestrians']} pedestrians; metres; "
        "[95 % bootstrap interval over pedestrians]",
        f"  {'metric':<12}{'model':<24}{'baseline':<28}model / baseline",
    ]
    baselines = {"top1_ADE": "cv_ADE", "top1_FDE": "cv_FDE", "minADE": "cv6_minADE"}
    ratio_of = {model: name for name, model, _ in RATIOS}
    for metric in ("top1_ADE", "top1_FDE", "minADE", "minFDE"):
        base_key = baselines.get(metric, "cv6_minFDE")
        label = "CV-6" if base_key.startswith("cv6") else "CV"
        model = f"{result[metric]:.3f} {_interval(ci[metric])}"
        base = f"{label} {result[base_key]:.3f} {_interval(ci[base_key])}"
        ratio = result["ratios"].get(ratio_of.get(metric, ""))
        text = "" if ratio is None else _ratio_text(ratio)
        lines.append(f"  {_label(metric):<12}{model:<24}{base:<28}{text}".rstrip())
    calib = result["calibration"]
    lines.append(
        f"  calibration: top-mode probability {calib['confidence']:.3f}, top mode best in "
        f"{calib['best_share']:.3f} of windows, expected calibration error {calib['ece']:.3f}"
    )
    lines.append(reliability_line(calib))
    return lines


def reliability_line(calib: Mapping[str, Any]) -> str:
    cells = [
        f"[{b['bin'][0]:.1f},{b['bin'][1]:.1f}) n={b['windows']} p={b['confidence']:.2f} "
        f"best={b['best_share']:.2f}"
        for b in calib["reliability"]
    ]
    return "  reliability: " + "; ".join(cells)


def _label(metric: str) -> str:
    return {
        "top1_ADE": "top-1 ADE",
        "top1_FDE": "top-1 FDE",
        "minADE": "minADE@6",
        "minFDE": "minFDE@6",
    }[metric]


def _interval(bounds: Sequence[float] | None) -> str:
    return "[n/a]" if bounds is None else f"[{bounds[0]:.3f}, {bounds[1]:.3f}]"


def _ratio_text(ratio: Mapping[str, Any]) -> str:
    if ratio["value"] is None:
        return "n/a"
    return f"x{ratio['value']:.3f} {_interval(ratio['ci95'])}"
