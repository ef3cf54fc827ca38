"""``dynshape-perception tune``: search node parameters against bags with seeded Optuna TPE."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

from optuna.trial import FrozenTrial

from dynshape_perception.cli.main import check_output_dir, check_output_file
from dynshape_perception.cli.replay import build_engine
from dynshape_perception.errors import ConfigError
from dynshape_perception.tools.replay.params import Value
from dynshape_perception.tools.replay.settings import ReplaySettings, settings_from_values
from dynshape_perception.tools.replay.tuning import (
    Evaluator,
    check_bags,
    check_tune_seed,
    first_complete,
    load_space,
    open_study,
    tune,
    write_best,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--space", type=Path, required=True, help="search space YAML")
    parser.add_argument("--bags", type=Path, nargs="+", required=True, help="bags to replay")
    parser.add_argument("--trials", type=int, default=20, help="trials to run in this process")
    parser.add_argument("--seed", type=int, default=0, help="sampler seed")
    parser.add_argument(
        "--storage",
        default=None,
        help="Optuna storage URL shared by several machines, e.g. sqlite:///study.db or "
        "postgresql://...; default: in memory",
    )
    parser.add_argument("--study", default=None, help="study name (default: the space's)")
    parser.add_argument("--out", type=Path, default=Path("best.param.yaml"), help="ROS params")
    parser.add_argument("--max-frames", type=int, default=None, help="frames per bag and trial")
    parser.add_argument("--target", default=None, help="target profile (default x86_64)")
    parser.add_argument("--cache-dir", type=Path, default=None, help="artefact cache folder")
    parser.add_argument("--weights-dir", type=Path, default=None, help="weights and manifest")


def run(args: argparse.Namespace) -> int:
    from dataclasses import replace

    from dynshape_perception import parameters as node_params

    space = load_space(args.space)
    if args.study:
        space = replace(space, study=args.study)
    check_tune_seed(args.seed)
    if args.trials < 1:
        raise ConfigError(f"--trials must be >= 1, got {args.trials}")
    check_output_file(args.out, "--out")
    if args.cache_dir:
        check_output_dir(args.cache_dir, "--cache-dir")
    if args.storage is not None:
        # Fails at once on a URL or file that is no Optuna study, before the engine is built.
        open_study(args.storage, space.study)
    check_bags(args.bags)

    def build(values: Mapping[str, Value]) -> ReplaySettings:
        return settings_from_values(values, "off", args.target)

    base = build(space.fixed)
    defaults = {name: spec.default for name, spec in node_params.all_specs().items()}
    with build_engine(base, args.cache_dir, args.weights_dir) as engine:
        evaluate = Evaluator(engine, args.bags, build, space.weights, args.max_frames)

        def show(trial: FrozenTrial) -> None:
            attrs = trial.user_attrs
            error = attrs.get("prediction_error_m")
            print(
                f"trial {trial.number:>3}: objective {_fmt(trial.value)} (misses "
                f"{attrs['miss_rate']:.3f}, p95 {attrs['latency_p95_ms']:.1f} ms, prediction "
                f"{'n/a' if error is None else f'{error:.3f} m'}) {trial.params}"
            )

        study = tune(space, evaluate, args.trials, args.seed, args.storage, defaults, show)
    out = write_best(study, space, args.out, args.bags)
    first = first_complete(study)
    first_text = "n/a" if first is None else f"{first.number}: {_fmt(first.value)}"
    print(
        f"best: trial {study.best_trial.number} objective {_fmt(study.best_value)} "
        f"(first completed trial {first_text}); {len(study.trials)} trials in study "
        f"{space.study!r}"
    )
    print(f"best parameters written to {out}")
    return 0


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.5g}"
