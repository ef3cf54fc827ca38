"""``dynshape-perception compile``: export one library per model, with a sidecar, for a profile."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from dynshape_perception.cli.main import check_output_dir
from dynshape_perception.compiler.build import hashed_module
from dynshape_perception.compiler.cache import ArtefactCache, default_cache_dir, export_to
from dynshape_perception.compiler.targets import available_profiles, load_profile
from dynshape_perception.errors import ConfigError
from dynshape_perception.models import MODEL_NAMES
from dynshape_perception.models.registry import committed_weights


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--model", choices=[*MODEL_NAMES, "all"], default="all")
    parser.add_argument("--target", default="x86_64", help=f"one of {available_profiles()}")
    parser.add_argument("--out", type=Path, default=None, help="output folder")
    parser.add_argument("--cache-dir", type=Path, default=None, help="artefact cache folder")
    parser.add_argument(
        "--ir-hash",
        action="store_true",
        help="print each model's IR hash for the target (what the artefact cache keys its "
        "build by) and build nothing: equal hashes, equal compiled code",
    )


def run(args: argparse.Namespace) -> int:
    profile = load_profile(args.target)
    names = MODEL_NAMES if args.model == "all" else (args.model,)
    if args.ir_hash:
        for name in names:
            model, weights = committed_weights(name)
            _, _, ir_hash = hashed_module(model, weights, profile, None, None, None)
            print(f"{name:<11} {profile.name:<12} {ir_hash}")
        return 0
    if args.out is None:
        raise ConfigError("compile needs --out, unless --ir-hash")
    check_output_dir(args.out, "--out")
    if args.cache_dir:
        check_output_dir(args.cache_dir, "--cache-dir")
    cache = ArtefactCache(args.cache_dir or default_cache_dir())
    for name in names:
        model, weights = committed_weights(name)
        artefact = cache.get_or_build(model, weights, profile)
        lib, side = export_to(artefact, args.out)
        built = f"built in {artefact.sidecar.compile_s:.2f} s"
        state = "cache hit" if artefact.cache_hit else built
        print(f"{name:<11} {profile.name:<12} {lib} ({lib.stat().st_size / 1e3:.0f} kB, {state})")
        print(f"{'':<11} sidecar {side}: {json.dumps(artefact.sidecar.symbolic_vars)}")
    return 0
