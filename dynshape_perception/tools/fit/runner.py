"""Fit one model by name and write its weights and manifest entry with full provenance."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dynshape_perception.config import check_seed
from dynshape_perception.errors import ConfigError
from dynshape_perception.models import MODEL_NAMES, model_definition
from dynshape_perception.models.common import ModelDef
from dynshape_perception.models.weights import read_manifest, save_weights
from dynshape_perception.tools.fit import associator, predictor, segmenter
from dynshape_perception.tools.fit.data import Source, parse_sources
from dynshape_perception.tools.fit.torch_env import fit_environment

log = logging.getLogger(__name__)

# (model, sources, seed, hyperparameters) -> (weights, provenance, statistics)
FitFn = Callable[
    [ModelDef, tuple[str, ...], int, Any],
    tuple[dict[str, np.ndarray], list[Source], dict[str, float]],
]


@dataclass(frozen=True)
class FitPlan:
    """One model's fit: its allowed data, the default mix, the fit and its hyperparameters."""

    sources: tuple[str, ...]
    default_data: str
    fit: FitFn
    hyperparameters: Any
    notes: str = ""


PLANS: Mapping[str, FitPlan] = {
    "predictor": FitPlan(
        sources=predictor.SOURCES,
        # Every real scene and crowd family: held-out figures come from
        # `evaluate prediction --leave-one-out`.
        default_data="crossing,dense,eth,groups,hotel,sparse,synthetic",
        fit=predictor.fit_predictor,
        hyperparameters=predictor.PredictorFitConfig(),
        notes="fitted on histories of 2 to 32 steps at 0.4 s (the ETH/UCY protocol observes 8); "
        "longer histories lie outside what it saw",
    ),
    "segmenter": FitPlan(
        sources=segmenter.SOURCES,
        default_data="synthetic",
        fit=segmenter.fit_segmenter,
        hyperparameters=segmenter.SegmenterFitConfig(),
    ),
    "associator": FitPlan(
        sources=associator.SOURCES,
        default_data="synthetic",
        fit=associator.fit_associator,
        hyperparameters=associator.AssociatorFitConfig(),
    ),
}


@dataclass(frozen=True)
class FitReport:
    model: str
    path: Path
    sha256: str
    command: str
    stats: dict[str, float]
    seconds: float


def fit_command(model: str, sources: tuple[str, ...], seed: int) -> str:
    """The command that reproduces a fit into the package's ``models/`` folder."""
    return f"dynshape-perception fit --model {model} --data {','.join(sources)} --seed {seed}"


def fit_and_save(model: str, data: str | None, seed: int, out_dir: Path | None = None) -> FitReport:
    """Fit ``model`` on the named sources and write ``<model>.npz`` and its manifest entry."""
    check_seed("--seed", seed)
    if model not in PLANS:
        raise ConfigError(f"unknown model {model!r}; expected one of {', '.join(MODEL_NAMES)}")
    plan = PLANS[model]
    sources = parse_sources(data or plan.default_data, plan.sources)
    definition = model_definition(model)
    started = time.perf_counter()
    weights, used, stats = plan.fit(definition, sources, seed, plan.hyperparameters)
    seconds = time.perf_counter() - started
    command = fit_command(model, sources, seed)
    entry: dict[str, Any] = {
        "model": model,
        "version": definition.version,
        "bounds": dict(definition.spec.bounds),
        "fit_command": command,
        "seed": seed,
        "data": [source.as_dict() for source in used],
        "hyperparameters": _plain(asdict(plan.hyperparameters)),
        "fit_stats": stats,
        "fit_environment": fit_environment(torch),
    }
    if plan.notes:
        entry["notes"] = plan.notes
    path = save_weights(model, weights, entry, out_dir)
    sha = read_manifest(path.parent)["models"][model]["sha256"]
    log.info("fitted %s in %.1f s: %s", model, seconds, path)
    return FitReport(model, path, sha, command, stats, seconds)


def _plain(value: Any) -> Any:
    """Tuples to lists, recursively, so the manifest stays plain YAML."""
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(item) for item in value]
    return value
