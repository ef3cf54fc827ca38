"""Parameter tuning against bags: a YAML search space, a weighted objective, seeded Optuna TPE."""

from __future__ import annotations

import math
import os
import socket
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import sqlalchemy.exc

from dynshape_perception.config import check_seed, read_yaml
from dynshape_perception.errors import ConfigError
from dynshape_perception.fsutil import atomic_write_text
from dynshape_perception.io.bags import BagReader
from dynshape_perception.io.topics import plan_topics
from dynshape_perception.runtime.engine import Engine
from dynshape_perception.stats import percentile
from dynshape_perception.tools.replay.inprocess import InProcessReplay, ReplayOptions, ReplayResult
from dynshape_perception.tools.replay.params import Value, dump_params
from dynshape_perception.tools.replay.settings import ReplaySettings, is_replay_parameter

DEFAULT_STUDY = "dynshape-perception"
DEFAULT_STARTUP_TRIALS = 10
SCHEMA_ATTEMPTS = 5
SCHEMA_RETRY_S = 0.5
# What PostgreSQL says to the process that loses the race to create Optuna's schema: a
# duplicate table, a duplicate object (a type) or a unique violation (its catalog row).
SCHEMA_RACE_SQLSTATES = frozenset({"42P07", "42710", "23505"})
MAX_SAMPLER_SEED = 2**32
SPACE_KEYS = {"study", "objective", "sampler", "fixed", "start", "parameters"}
SAMPLER_KEYS = {"startup_trials"}
OBJECTIVE_KEYS = {
    "deadline_misses",
    "latency_ms",
    "prediction_error_m",
    "unpredicted_penalty_m",
    "match_radius_m",
}


@dataclass(frozen=True)
class Weights:
    """Objective = misses x miss rate + latency x p95 frame ms + prediction x error (m)."""

    deadline_misses: float = 1.0
    latency_ms: float = 0.001
    prediction_error_m: float = 1.0
    unpredicted_penalty_m: float = 2.0
    match_radius_m: float = 2.0

    def __post_init__(self) -> None:
        for name, value in vars(self).items():
            if not (_is_number(value) and value >= 0):
                raise ConfigError(f"objective.{name} must be a number >= 0, got {value!r}")


@dataclass(frozen=True)
class Dimension:
    """One tuned parameter: a float or int range (optionally log) or a list of choices."""

    name: str
    low: float | int | None = None
    high: float | int | None = None
    log: bool = False
    choices: tuple[Value, ...] = ()

    def suggest(self, trial: optuna.Trial) -> Value:
        if self.choices:
            choice = trial.suggest_categorical(self.name, list(self.choices))
            assert choice is not None
            return choice
        assert self.low is not None and self.high is not None
        if isinstance(self.low, int) and isinstance(self.high, int):
            return trial.suggest_int(self.name, self.low, self.high, log=self.log)
        return trial.suggest_float(self.name, float(self.low), float(self.high), log=self.log)

    def contains(self, value: Value) -> bool:
        if self.choices:
            return value in self.choices
        assert self.low is not None and self.high is not None
        number = isinstance(value, (int, float)) and not isinstance(value, bool)
        return number and self.low <= value <= self.high  # type: ignore[operator]


@dataclass(frozen=True)
class Space:
    dimensions: tuple[Dimension, ...]
    weights: Weights = field(default_factory=Weights)
    fixed: dict[str, Value] = field(default_factory=dict)
    start: dict[str, Value] = field(default_factory=dict)
    study: str = DEFAULT_STUDY
    startup_trials: int = DEFAULT_STARTUP_TRIALS


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _is_value(value: object) -> bool:
    """A scalar a ROS parameter can hold: bool, int, finite float or string."""
    return isinstance(value, (bool, str)) or _is_number(value)


def _dimension(name: str, spec: Any) -> Dimension:
    if not isinstance(spec, dict):
        raise ConfigError(f"parameters.{name} must be a mapping (low/high or choices)")
    unknown = set(spec) - {"low", "high", "log", "choices"}
    if unknown:
        raise ConfigError(f"parameters.{name}: unknown keys {sorted(unknown, key=str)}")
    if "choices" in spec:
        choices = spec["choices"]
        if not isinstance(choices, list) or not choices:
            raise ConfigError(f"parameters.{name}.choices must be a non-empty list")
        if set(spec) - {"choices"}:
            raise ConfigError(f"parameters.{name}: choices take no low, high or log")
        bad = [c for c in choices if not _is_value(c)]
        if bad:
            raise ConfigError(
                f"parameters.{name}.choices must be booleans, numbers or strings, got {bad!r}"
            )
        return Dimension(name, choices=tuple(choices))
    low, high = spec.get("low"), spec.get("high")
    if not (_is_number(low) and _is_number(high)) or not low < high:  # type: ignore[operator]
        raise ConfigError(
            f"parameters.{name} needs finite numbers low < high, got {low!r}, {high!r}"
        )
    log = spec.get("log", False)
    if not isinstance(log, bool):
        raise ConfigError(f"parameters.{name}.log must be true or false, got {log!r}")
    if log and low <= 0:  # type: ignore[operator]
        raise ConfigError(f"parameters.{name}: a log range needs low > 0")
    return Dimension(name, low, high, log)  # type: ignore[arg-type]


def _values(path: Path, key: str, raw: object) -> dict[str, Value]:
    """``fixed`` or ``start``: parameter names to scalar values."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: {key} must be a mapping of parameter names to values")
    for name, value in raw.items():
        if not isinstance(name, str):
            raise ConfigError(f"{path}: {key} has a parameter name {name!r} that is not a string")
        if not _is_value(value):
            raise ConfigError(
                f"{path}: {key}.{name} must be a boolean, finite number or string, got {value!r}"
            )
    return dict(raw)


def _startup_trials(path: Path, sampler: object) -> int:
    if sampler is None:
        return DEFAULT_STARTUP_TRIALS
    if not isinstance(sampler, dict):
        raise ConfigError(f"{path}: sampler must be a mapping, got {sampler!r}")
    unknown = set(sampler) - SAMPLER_KEYS
    if unknown:
        raise ConfigError(
            f"{path}: sampler: unknown keys {sorted(unknown, key=str)}; "
            f"it takes {sorted(SAMPLER_KEYS)}"
        )
    startup = sampler.get("startup_trials", DEFAULT_STARTUP_TRIALS)
    if isinstance(startup, bool) or not isinstance(startup, int) or startup < 1:
        raise ConfigError(
            f"{path}: sampler.startup_trials must be an integer >= 1, got {startup!r}"
        )
    return startup


def load_space(path: Path) -> Space:
    raw = read_yaml(path, "search space")
    if not isinstance(raw, dict) or not isinstance(raw.get("parameters"), dict):
        raise ConfigError(f"{path} needs a 'parameters' mapping of ranges")
    unknown = set(raw) - SPACE_KEYS
    if unknown:
        raise ConfigError(f"{path}: unknown keys {sorted(unknown, key=str)}")
    objective = raw.get("objective") or {}
    if not isinstance(objective, dict) or set(objective) - OBJECTIVE_KEYS:
        raise ConfigError(f"{path}: objective takes {sorted(OBJECTIVE_KEYS)}")
    startup = _startup_trials(path, raw.get("sampler"))
    names = [n for n in raw["parameters"] if not isinstance(n, str)]
    if names:
        raise ConfigError(f"{path}: parameter names must be strings, got {names!r}")
    dims = tuple(_dimension(n, s) for n, s in raw["parameters"].items())
    fixed = _values(path, "fixed", raw.get("fixed"))
    start = _values(path, "start", raw.get("start"))
    study = raw.get("study", DEFAULT_STUDY)
    if not isinstance(study, str) or not study:
        raise ConfigError(f"{path}: study must be a non-empty name, got {study!r}")
    clash = {d.name for d in dims} & set(fixed)
    if clash:
        raise ConfigError(f"{path}: {sorted(clash)} are both fixed and tuned")
    untuned = sorted(set(start) - {d.name for d in dims})
    if untuned:
        raise ConfigError(f"{path}: start values for parameters that are not tuned: {untuned}")
    outside = [d.name for d in dims if d.name in start and not d.contains(start[d.name])]
    if outside:
        raise ConfigError(f"{path}: start values outside their ranges: {outside}")
    if any(n.startswith("jit.") for n in [*fixed, *(d.name for d in dims)]):
        raise ConfigError(f"{path}: tuning replays with the JIT off; jit.* cannot be set")
    return Space(
        dimensions=dims,
        weights=Weights(**objective),
        fixed=fixed,
        start=start,
        study=study,
        startup_trials=startup,
    )


@dataclass(frozen=True)
class Score:
    """The objective's parts over every bag of a trial."""

    miss_rate: float
    latency_p95_ms: float
    prediction_error_m: float | None
    frames: int

    def value(self, weights: Weights) -> float:
        error = self.prediction_error_m if self.prediction_error_m is not None else 0.0
        return (
            weights.deadline_misses * self.miss_rate
            + weights.latency_ms * self.latency_p95_ms
            + weights.prediction_error_m * error
        )


def score_results(results: Sequence[ReplayResult], penalty_m: float) -> Score:
    misses = checked = matched = unpredicted = 0
    error_sum = 0.0
    totals: list[float] = []
    for result in results:
        summary = result.summary()
        for frame in result.metrics.frames:
            if frame.drop_reason is None:
                totals.append(frame.latency_ms.get("total", 0.0))
            checked += sum(
                1 for t in frame.completion_ms if result.metrics.deadlines_ms.get(int(t))
            )
        misses += sum(summary["deadline_misses"].values())
        pred = summary.get("prediction")
        if pred:
            matched += int(pred["matched"])
            unpredicted += int(pred["unpredicted"])
            if pred["min_ade_m"] is not None:
                error_sum += float(pred["min_ade_m"]) * int(pred["matched"])
    scored = matched + unpredicted
    return Score(
        miss_rate=misses / checked if checked else 0.0,
        latency_p95_ms=percentile(totals, 95) if totals else 0.0,
        prediction_error_m=(error_sum + penalty_m * unpredicted) / scored if scored else None,
        frames=len(totals),
    )


SettingsBuilder = Callable[[Mapping[str, Value]], ReplaySettings]


class Evaluator:
    """Replays every bag in process with one trial's parameters and scores it."""

    def __init__(
        self,
        engine: Engine,
        bags: Sequence[Path],
        build: SettingsBuilder,
        weights: Weights,
        max_frames: int | None = None,
    ) -> None:
        self.engine = engine
        self.bags = list(bags)
        self.build = build
        self.weights = weights
        self.options = ReplayOptions(
            max_frames=max_frames,
            progress=False,
            match_radius_m=weights.match_radius_m,
            unpredicted_penalty_m=weights.unpredicted_penalty_m,
        )

    def __call__(self, values: Mapping[str, Value]) -> Score:
        settings = self.build(values)
        unused = [n for n in values if not is_replay_parameter(n)]
        if unused:
            raise ConfigError(f"in-process replay does not use {unused}; tune other parameters")
        replay = InProcessReplay(self.engine, settings)
        results = [replay.run(bag, self.options) for bag in self.bags]
        if not any(r.frames for r in results):
            raise ConfigError("none of the bags has anything to replay")
        return score_results(results, self.weights.unpredicted_penalty_m)


def check_bags(paths: Sequence[Path]) -> None:
    """Every bag opens, passes its integrity check and has frames to replay.

    Checked before the study starts: a bad bag found in a trial would leave a failed
    trial in a shared study, where every other worker sees it.
    """
    for path in paths:
        with BagReader(path) as reader:
            reader.verify()
            if plan_topics(reader.topics(), None, {}).driver is None:
                raise ConfigError(
                    f"bag {path} has nothing to replay: no points, obstacles or detections "
                    "topic with messages"
                )


def check_tune_seed(seed: object) -> int:
    """A sampler seed: the package's seed rule, and below Optuna's (NumPy's) 2**32."""
    seed = check_seed("--seed", seed)
    if seed >= MAX_SAMPLER_SEED:
        raise ConfigError(f"--seed must be below 2**32 for Optuna's sampler, got {seed}")
    return seed


@contextmanager
def storage_errors(storage: str | None) -> Iterator[None]:
    """What a storage URL that is no Optuna study raises, as one ConfigError line."""
    try:
        yield
    except (
        ValueError,
        ImportError,
        sqlalchemy.exc.SQLAlchemyError,
        optuna.exceptions.OptunaError,
    ) as err:
        first = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"cannot open Optuna storage {storage!r}: {first}") from err


def lost_schema_race(err: sqlalchemy.exc.DBAPIError) -> bool:
    """Whether ``err`` says that another process created a piece of Optuna's schema first."""
    if isinstance(err, sqlalchemy.exc.IntegrityError):
        return True
    # psycopg names it sqlstate, psycopg2 pgcode.
    state = getattr(err.orig, "sqlstate", None) or getattr(err.orig, "pgcode", None)
    return state in SCHEMA_RACE_SQLSTATES


def open_study(storage: str, study: str) -> int:
    """Create or load ``study`` in ``storage`` and return how many trials it holds.

    Called before the (slow) engine is built, so a bad URL or a file that is no Optuna
    database fails at once.
    """
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    with storage_errors(storage):
        for attempt in range(SCHEMA_ATTEMPTS):
            try:
                return len(
                    optuna.create_study(
                        study_name=study, storage=storage, direction="minimize", load_if_exists=True
                    ).trials
                )
            except (sqlalchemy.exc.IntegrityError, sqlalchemy.exc.ProgrammingError) as err:
                # Processes that join an empty database at once race to create Optuna's
                # tables; the loser finds them next time.
                if not lost_schema_race(err) or attempt == SCHEMA_ATTEMPTS - 1:
                    raise
                time.sleep(SCHEMA_RETRY_S * (attempt + 1))
    raise AssertionError("unreachable")


def join_study(
    space: Space,
    seed: int,
    storage: str | None,
    defaults: Mapping[str, Value] | None = None,
    constant_liar: bool = False,
) -> optuna.Study:
    """The (possibly shared) study of ``space``, created or joined, with its sampler seeded by
    ``seed`` plus the trials the study held when this process joined; a new study's first
    trial is the start point (``start``, else ``defaults``). ``constant_liar`` keeps trials
    that run at once apart."""
    check_tune_seed(seed)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    existing = 0 if storage is None else open_study(storage, space.study)
    if seed + existing >= MAX_SAMPLER_SEED:
        raise ConfigError(
            f"--seed {seed} plus the {existing} trials study {space.study!r} holds must stay "
            f"below 2**32, Optuna's seed limit"
        )
    sampler = optuna.samplers.TPESampler(
        seed=seed + existing, n_startup_trials=space.startup_trials, constant_liar=constant_liar
    )
    with storage_errors(storage):
        study = optuna.create_study(
            study_name=space.study,
            storage=storage,
            sampler=sampler,
            direction="minimize",
            load_if_exists=True,
        )
    if existing == 0:
        start = {**dict(defaults or {}), **space.start}
        first = {d.name: start[d.name] for d in space.dimensions if d.name in start}
        first = {n: v for n, v in first.items() if _dim(space, n).contains(v)}
        if first:
            study.enqueue_trial(first, skip_if_exists=True)
    return study


def tune(
    space: Space,
    evaluate: Callable[[Mapping[str, Value]], Score],
    trials: int,
    seed: int,
    storage: str | None = None,
    defaults: Mapping[str, Value] | None = None,
    on_trial: Callable[[optuna.trial.FrozenTrial], None] | None = None,
) -> optuna.Study:
    """Run ``trials`` more trials of the (possibly shared) study and return it.

    The first trial of a new study is the start point (``start``, else ``defaults``), so
    the improvement over it is measured. Each process seeds its sampler with ``seed`` plus
    the trials the study held when it joined: sequential runs are reproducible, and
    workers that join later do not repeat the random start-up of the first.
    """
    if trials < 1:
        raise ConfigError(f"trials must be >= 1, got {trials}")
    study = join_study(space, seed, storage, defaults)

    def objective(trial: optuna.Trial) -> float:
        values = {**space.fixed, **{d.name: d.suggest(trial) for d in space.dimensions}}
        score = evaluate(values)
        trial.set_user_attr("driver", f"{socket.gethostname()}:{os.getpid()}")
        trial.set_user_attr("miss_rate", score.miss_rate)
        trial.set_user_attr("latency_p95_ms", score.latency_p95_ms)
        trial.set_user_attr("prediction_error_m", score.prediction_error_m)
        trial.set_user_attr("frames", score.frames)
        return score.value(space.weights)

    callbacks = [lambda _study, trial: on_trial(trial)] if on_trial is not None else None
    # A failing trial re-raises here and is reported once, as one line; Optuna's own report
    # of it is a traceback.
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    study.optimize(objective, n_trials=trials, callbacks=callbacks, catch=())
    return study


def first_complete(study: optuna.Study) -> optuna.trial.FrozenTrial | None:
    """The study's first completed trial: in a shared study trial 0 may have failed."""
    complete = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    return min(complete, key=lambda t: t.number, default=None)


def _dim(space: Space, name: str) -> Dimension:
    return next(d for d in space.dimensions if d.name == name)


def write_best(study: optuna.Study, space: Space, out: Path, bags: Sequence[Path]) -> Path:
    """The best trial's parameters (and the fixed ones) as a ready ROS params file."""
    if first_complete(study) is None:
        raise ConfigError(f"study {space.study!r} holds no completed trial: no best parameters")
    best = study.best_trial
    values: dict[str, Value] = {**space.fixed, **best.params}
    attrs = best.user_attrs
    comment = "\n".join(
        [
            f"Tuned by dynshape-perception tune: study {space.study!r}, trial {best.number} "
            f"of {len(study.trials)}",
            f"objective {best.value:.6g}: deadline-miss rate {attrs.get('miss_rate')}, "
            f"p95 latency {attrs.get('latency_p95_ms')} ms, "
            f"prediction error {attrs.get('prediction_error_m')} m",
            "bags: " + ", ".join(str(b) for b in bags),
        ]
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, dump_params(values, comment=comment))
    out.chmod(0o644)
    return out
