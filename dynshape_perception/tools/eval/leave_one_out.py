"""Leave one part out (a real scene or a crowd family): fit the predictor on the rest, score it."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from dynshape_perception.errors import ConfigError, DataError
from dynshape_perception.io.datasets import read_eth_ucy
from dynshape_perception.perception.prediction.history import Tracks
from dynshape_perception.tools.eval.prediction import (
    OBS_STEPS,
    PRED_STEPS,
    RATIOS,
    extract_windows,
)

REAL = "real"
GENERATED = "generated"
# Held-out scenes of a generated family come from seeds this far from the fit's.
EVAL_SEED_OFFSET = 10_000
EVAL_SCENES = 12
# Frames of one generated scene, and between two scenes' frames (none shared).
FRAME_STEP = 10
SCENE_FRAMES = 100_000


@dataclass(frozen=True)
class Part:
    """What one leave-one-out turn leaves out: a real scene file, or a generated family."""

    name: str
    kind: str
    path: Path | None = None
    sha256: str = ""


# (weights, the part left out) -> the report of ``evaluate_prediction`` on it.
Scorer = Callable[[Mapping[str, np.ndarray], Part], dict[str, Any]]
# (real scenes fitted on: name -> file, families fitted on) -> (weights, fit statistics).
Fitter = Callable[
    [Mapping[str, Path], tuple[str, ...]], tuple[dict[str, np.ndarray], dict[str, float]]
]


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


def family_eval_tracks(name: str, seed: int) -> Tracks:
    """Held-out scenes of a generated family as tracks: seeds the fits never use, each
    scene in frames of its own."""
    from dynshape_perception.tools.fit.data import GeneratedFamilies, family_tracks

    spec = GeneratedFamilies(scenes=EVAL_SCENES)
    tracks: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for index, scene in enumerate(family_tracks(name, seed + EVAL_SEED_OFFSET, spec)):
        frames = index * SCENE_FRAMES + FRAME_STEP * np.arange(scene.shape[1], dtype=np.int64)
        for agent in range(scene.shape[0]):
            tracks[len(tracks)] = (frames, scene[agent])
    return tracks


def leave_one_out(
    scenes: Sequence[Scene],
    families: Sequence[str],
    all_families: Sequence[str],
    fit: Fitter,
    score: Scorer,
    progress: Callable[[str], None] | None = None,
) -> list[dict[str, Any]]:
    """For each real scene, then each of ``families``: weights fitted without it, and its
    report on them. Every fit takes the other real scenes, ``all_families`` but the one
    left out, and the generated walkers. ``progress`` hears each part's overview line as
    it is scored: a run of several fits takes a while."""
    parts = [Part(s.name, REAL, s.path, s.sha256) for s in scenes]
    parts += [Part(name, GENERATED) for name in families]
    rows = []
    for held in parts:
        real = {s.name: s.path for s in scenes if held.kind != REAL or s.name != held.name}
        kept = tuple(f for f in all_families if held.kind != GENERATED or f != held.name)
        started = time.perf_counter()
        weights, stats = fit(real, kept)
        fit_s = time.perf_counter() - started
        result = score(weights, held)
        where = {"file": str(held.path), "sha256": held.sha256} if held.path else {}
        rows.append(
            {
                "scene": held.name,
                "kind": held.kind,
                **where,
                "fitted_on": [*sorted(real), *kept, "synthetic"],
                "fit_s": round(fit_s, 1),
                "fit_stats": stats,
                **result,
            }
        )
        if progress is not None:
            progress(overview_lines(rows[-1:])[-1].strip() + f" (fit {fit_s:.0f} s)")
    return rows


def summary_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """The leave-one-out table: per scene, each metric and ratio with its 95 % interval."""
    lines = [
        "leave-one-out: each real scene and crowd family scored by weights fitted on the "
        "other real scenes, the other families and generated walkers",
        *overview_lines(rows),
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
    rank = result.get("ranking")
    if rank:
        lines.append(
            f"  ranking: CV ranked first in {rank['top_is_cv_share']:.3f} of windows; where the "
            f"learned mode is, stated {_maybe(rank['opened_stated'])}, clear gain in "
            f"{_maybe(rank['opened_clear_gain_share'])}, beats CV in "
            f"{_maybe(rank['opened_beats_cv_share'])} ({rank['opened_windows']} windows); "
            f"top-1 beats CV in {rank['top1_beats_cv_share']:.3f} of all windows"
        )
    for key, title in (("by_people_in_view", "people in view"), ("by_speed_mps", "speed")):
        for row in result.get("breakdown", {}).get(key, []):
            lines.append(
                f"  {title} {row['bin']}: {row['windows']} windows, top-1 / CV "
                f"{_maybe(row['top1_ADE/cv_ADE'])}, minADE / CV-6 "
                f"{_maybe(row['minADE/cv6_minADE'])}, minFDE / CV-6 "
                f"{_maybe(row['minFDE/cv6_minFDE'])}"
            )
    return lines


def overview_lines(rows: Sequence[Mapping[str, Any]]) -> list[str]:
    """One line per part left out: the three ratios with their 95 % intervals."""
    lines = ["", f"  {'left out':<12}{'top-1 / CV':<26}{'minADE / CV-6':<26}minFDE / CV-6"]
    for row in rows:
        cells = [_ratio_text(row["ratios"][name]) for name, _, _ in RATIOS]
        lines.append(f"  {row['scene']:<12}{cells[0]:<26}{cells[1]:<26}{cells[2]}")
    return lines


def _maybe(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3f}"


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
