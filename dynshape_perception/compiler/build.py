"""Compile one model for one target profile through a numbered pipeline."""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dynshape_perception.compiler import tvm_adapter as tvmx
from dynshape_perception.compiler.schedules import apply_cpu_rules, context_for_target
from dynshape_perception.compiler.targets import TargetProfile
from dynshape_perception.errors import CompileError
from dynshape_perception.models.common import ModelDef

log = logging.getLogger(__name__)
# The field of the log record of each compile that holds its seconds.
COMPILE_SECONDS = "compile_s"

_PIPELINE_SOURCES = (
    Path(__file__),
    Path(__file__).with_name("schedules") / "rules.py",
    Path(__file__).with_name("schedules") / "context.py",
    Path(__file__).with_name("schedules") / "templates.py",
    Path(__file__).with_name("tvm_adapter.py"),
)


def pipeline_version() -> str:
    """A digest of the compiler's own code: a change to a schedule rule invalidates the cache."""
    digest = hashlib.sha256()
    for path in _PIPELINE_SOURCES:
        digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


@dataclass
class BuildResult:
    model: str
    profile: TargetProfile
    executable: Any
    ir_hash: str
    dims: dict[str, int]
    bounds: dict[str, int]
    schedule: dict[str, str] = field(default_factory=dict)
    compile_s: float = 0.0
    planned_bytes: dict[str, int] = field(default_factory=dict)
    functions: tuple[str, ...] = ()
    # See ``ScheduleReport.shape_invariant``; GPU schedules choose by extents, so never there.
    shape_invariant: bool = False


def bound_module(
    model: ModelDef,
    weights: Mapping[str, np.ndarray],
    dims: Mapping[str, int] | None = None,
    gpu: bool = False,
    functions: Sequence[str] | None = None,
) -> tuple[tvmx.IRModule, dict[str, int]]:
    """Steps 1-2: export the Relax module (symbolic, or pinned to ``dims``) and bind weights.

    Weights become constants, so the library is self-contained and weight layouts are fixed at
    compile time rather than per call.
    """
    mod, params = tvmx.export_module(model.build_module(gpu), model.spec.tvm_spec(dims, functions))
    names = [name for name, _ in params]
    missing = set(names) - set(weights)
    if missing:
        raise CompileError(f"{model.name}: no weights for {sorted(missing)}")
    mod = tvmx.bind_weights(mod, {n: weights[n] for n in names})
    bounds = {d: int(b) for d, b in model.spec.bounds.items() if not dims or d not in dims}
    return mod, bounds


def hashed_module(
    model: ModelDef,
    weights: Mapping[str, np.ndarray],
    profile: TargetProfile,
    dims: Mapping[str, int] | None,
    functions: Sequence[str] | None,
    bound: tuple[tvmx.IRModule, dict[str, int]] | None,
) -> tuple[tvmx.IRModule, dict[str, int], str]:
    """``bound_module`` for ``profile`` (unless ``bound`` holds it already) and its IR's
    structural hash: what a build compiles and what its cache key names."""
    mod, bounds = bound or bound_module(model, weights, dims, profile.is_cuda, functions)
    return mod, bounds, tvmx.structural_hash(mod)


def compile_model(
    model: ModelDef,
    weights: Mapping[str, np.ndarray],
    profile: TargetProfile,
    dims: Mapping[str, int] | None = None,
    functions: Sequence[str] | None = None,
    bound: tuple[tvmx.IRModule, dict[str, int]] | None = None,
) -> BuildResult:
    """(model, target profile[, pinned dims][, entry points]) -> executable, in five steps.

    ``bound`` is steps 1-2 already done (the cache exports once to compute its key).
    """
    started = time.perf_counter()
    target = profile.target()
    # Step 1-2: export and bind weights.
    mod, bounds, ir_hash = hashed_module(model, weights, profile, dims, functions, bound)
    # Step 3: upper bounds for memory planning of the symbolic dims left.
    mod = tvmx.set_upper_bounds(mod, bounds)
    # Step 4: legalise, fuse, then schedule with the CPU rules or GPU defaults.
    mod = tvmx.lower_to_tir(mod, target)
    report: dict[str, str] = {}
    invariant = False
    if profile.is_cuda:
        mod = tvmx.apply_gpu_default_schedules(mod, target)
        report = {name: "dlight.gpu" for name in tvmx.prim_funcs(mod)}
    else:
        mod, sched = apply_cpu_rules(mod, context_for_target(target))
        report = dict(sched.applied)
        invariant = sched.shape_invariant
    planned = tvmx.planned_storage_bytes(mod)
    # Step 5: build.
    executable = tvmx.build(mod, target)
    elapsed = time.perf_counter() - started
    # The record carries the seconds as a field too, on the compiling thread's record.
    log.info(
        "compiled %s for %s%s in %.2f s",
        model.name,
        profile.name,
        f" {dict(dims)}" if dims else "",
        elapsed,
        extra={COMPILE_SECONDS: elapsed},
    )
    return BuildResult(
        model=model.name,
        profile=profile,
        executable=executable,
        ir_hash=ir_hash,
        dims=dict(dims or {}),
        bounds=bounds,
        schedule=report,
        compile_s=elapsed,
        planned_bytes=planned,
        functions=tuple(functions or (fn.name for fn in model.spec.functions)),
        shape_invariant=invariant,
    )
