"""Tuning trials as Ray tasks: Optuna's ask-and-tell in the driver, one task per trial."""

from __future__ import annotations

import os
import random
import socket
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import optuna

from dynshape_perception.errors import ConfigError
from dynshape_perception.tools.fleet import task
from dynshape_perception.tools.fleet.cluster import WAIT_S
from dynshape_perception.tools.replay.params import Value
from dynshape_perception.tools.replay.settings import (
    ReplaySettings,
    is_replay_parameter,
    settings_from_values,
)
from dynshape_perception.tools.replay.tuning import (
    Evaluator,
    Score,
    Space,
    Weights,
    join_study,
)


@dataclass(frozen=True)
class TrialJob:
    values: Mapping[str, Value]
    bags: tuple[Path, ...]
    engine: task.EngineSpec = field(default_factory=task.EngineSpec)
    weights: Weights = field(default_factory=Weights)
    max_frames: int | None = None


def sample_bags(bags: Sequence[Path], count: int | None, seed: int) -> list[Path]:
    """``count`` bags drawn with ``seed`` (all when None): every trial of a study replays
    the same sample, so that their objectives compare."""
    if count is None or count >= len(bags):
        return list(bags)
    if count < 1:
        raise ConfigError(f"--sample must be >= 1, got {count}")
    return sorted(random.Random(seed).sample(list(bags), count))


def dims_of(space: Space) -> list[str]:
    return [d.name for d in space.dimensions]


def evaluate_trial(job: TrialJob) -> dict[str, Any]:
    """One trial's parameters over the bags, in this worker, on its (reused) engine."""

    def build(values: Mapping[str, Value]) -> ReplaySettings:
        return settings_from_values(values, "off", job.engine.target)

    engine = task.engine_for(job.engine, build(job.values))
    score = Evaluator(engine, job.bags, build, job.weights, job.max_frames)(job.values)
    info = task.worker_info()
    return {**asdict(score), "worker": f"{info.host}:{info.pid}", "node_id": info.node_id}


def tune_on_ray(
    ray: Any,
    space: Space,
    job: TrialJob,
    trials: int,
    seed: int,
    storage: str | None,
    parallel: int,
    defaults: Mapping[str, Value] | None = None,
    on_trial: Callable[[optuna.trial.FrozenTrial], None] | None = None,
) -> optuna.Study:
    """Run ``trials`` more trials of the (possibly shared) study, ``parallel`` at a time.

    As ``tuning.tune``: the first trial of a new study is the start point, and the sampler
    is seeded with ``seed`` plus the trials the study held when this process joined. TPE's
    constant liar keeps trials running at once apart.
    """
    if trials < 1 or parallel < 1:
        raise ConfigError(f"trials and parallel trials must be >= 1, got {trials}, {parallel}")
    study = join_study(space, seed, storage, defaults, constant_liar=True)
    unused = [n for n in [*space.fixed, *dims_of(space)] if not is_replay_parameter(n)]
    if unused:
        raise ConfigError(f"in-process replay does not use {unused}; tune other parameters")
    remote = ray.remote(num_cpus=1, max_retries=3)(evaluate_trial)
    driver = f"{socket.gethostname()}:{os.getpid()}"
    running: dict[Any, optuna.Trial] = {}
    asked = 0
    while asked < trials or running:
        while asked < trials and len(running) < parallel:
            trial = study.ask()
            trial.set_user_attr("driver", driver)
            values = {**space.fixed, **{d.name: d.suggest(trial) for d in space.dimensions}}
            trial_job = TrialJob(values, job.bags, job.engine, job.weights, job.max_frames)
            running[remote.remote(trial_job)] = trial
            asked += 1
        ready, _ = ray.wait(list(running), num_returns=1, timeout=WAIT_S)
        for ref in ready:
            trial = running.pop(ref)
            try:
                result = ray.get(ref)
            except ray.exceptions.RayError as err:
                study.tell(trial, state=optuna.trial.TrialState.FAIL)
                cause = getattr(err, "cause", None) or err
                text = " ".join(str(cause).split())
                raise ConfigError(f"trial {trial.number} failed: {text[:300]}") from err
            for name in ("miss_rate", "latency_p95_ms", "prediction_error_m", "frames"):
                trial.set_user_attr(name, result[name])
            trial.set_user_attr("worker", result["worker"])
            trial.set_user_attr("node_id", result["node_id"])
            score = Score(*(result[f.name] for f in fields(Score)))
            frozen = study.tell(trial, score.value(space.weights))
            if on_trial is not None:
                on_trial(frozen)
    return study
