"""``dynshape-perception tune``: search node parameters against bags with seeded Optuna TPE."""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from pathlib import Path

import optuna
from optuna.trial import FrozenTrial

from dynshape_perception.cli.main import check_output_dir, check_output_file
from dynshape_perception.cli.replay import build_engine
from dynshape_perception.errors import ConfigError
from dynshape_perception.tools.replay.params import Value
from dynshape_perception.tools.replay.settings import ReplaySettings, settings_from_values
from dynshape_perception.tools.replay.trials_report import write_trials_report
from dynshape_perception.tools.replay.tuning import (
    Evaluator,
    Space,
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
    parser.add_argument("--bags", type=Path, nargs="+", default=[], help="bags to replay")
    parser.add_argument(
        "--corpus", type=Path, default=None, help="a folder of bags or a manifest, with --bags"
    )
    parser.add_argument(
        "--sample", type=int, default=None, help="replay a sample of N bags, drawn with --seed"
    )
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
    parser.add_argument(
        "--report", type=Path, default=None, help="HTML of the trials (default: --out as .html)"
    )
    ray = parser.add_argument_group("Ray: trials in parallel, one task each")
    ray.add_argument("--address", default=None, help="a Ray cluster: auto or HOST:PORT")
    ray.add_argument(
        "--parallel",
        type=int,
        default=None,
        help="trials at once (embedded Ray with N CPUs; default on a cluster: its CPUs)",
    )


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
    bags = _bags(args)
    check_bags(bags)
    report = args.report or args.out.with_suffix(".html")
    check_output_file(report, "--report")
    defaults = {name: spec.default for name, spec in node_params.all_specs().items()}
    if args.address is not None or args.parallel is not None:
        study = _tune_on_ray(args, space, bags, defaults)
    else:
        study = _tune_here(args, space, bags, defaults)
    out = write_best(study, space, args.out, bags)
    first = first_complete(study)
    first_text = "n/a" if first is None else f"{first.number}: {_fmt(first.value)}"
    print(
        f"best: trial {study.best_trial.number} objective {_fmt(study.best_value)} "
        f"(first completed trial {first_text}); {len(study.trials)} trials in study "
        f"{space.study!r}"
    )
    print(f"best parameters written to {out}")
    print(f"report of the trials written to {write_trials_report(study, report)}")
    return 0


def _bags(args: argparse.Namespace) -> list[Path]:
    bags = list(args.bags)
    if args.corpus is not None:
        from dynshape_perception.tools.fleet.corpus import load_corpus

        bags += [entry.path for entry in load_corpus(args.corpus)]
    if not bags:
        raise ConfigError("give the bags to replay: --bags BAG ... and/or --corpus CORPUS")
    from dynshape_perception.tools.fleet.trials import sample_bags

    return sample_bags(bags, args.sample, args.seed)


def _show(trial: FrozenTrial) -> None:
    attrs = trial.user_attrs
    error = attrs.get("prediction_error_m")
    print(
        f"trial {trial.number:>3}: objective {_fmt(trial.value)} (misses "
        f"{attrs['miss_rate']:.3f}, p95 {attrs['latency_p95_ms']:.1f} ms, prediction "
        f"{'n/a' if error is None else f'{error:.3f} m'}) {trial.params}"
    )


def _tune_on_ray(
    args: argparse.Namespace, space: Space, bags: list[Path], defaults: dict[str, Value]
) -> optuna.Study:
    from dynshape_perception.tools.fleet.cluster import RayOptions, ray_session, warm_up
    from dynshape_perception.tools.fleet.task import EngineSpec
    from dynshape_perception.tools.fleet.trials import TrialJob, tune_on_ray

    if args.parallel is not None and args.parallel < 1:
        raise ConfigError(f"--parallel must be >= 1, got {args.parallel}")
    spec = EngineSpec(
        args.target,
        args.cache_dir.resolve() if args.cache_dir else None,
        args.weights_dir.resolve() if args.weights_dir else None,
    )
    job = TrialJob({}, tuple(b.resolve() for b in bags), spec, space.weights, args.max_frames)
    workers = args.parallel if args.address is None else None
    with ray_session(RayOptions(args.address, workers)) as ray:
        parallel = args.parallel or max(int(ray.cluster_resources().get("CPU", 1)), 1)
        warm_up(ray, spec, space.fixed)
        return tune_on_ray(
            ray, space, job, args.trials, args.seed, args.storage, parallel, defaults, _show
        )


def _tune_here(
    args: argparse.Namespace, space: Space, bags: list[Path], defaults: dict[str, Value]
) -> optuna.Study:
    def build(values: Mapping[str, Value]) -> ReplaySettings:
        return settings_from_values(values, "off", args.target)

    base = build(space.fixed)
    with build_engine(base, args.cache_dir, args.weights_dir) as engine:
        evaluate = Evaluator(engine, bags, build, space.weights, args.max_frames)
        return tune(space, evaluate, args.trials, args.seed, args.storage, defaults, _show)


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.5g}"
