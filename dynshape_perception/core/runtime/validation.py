"""Phase one of the switch: check a specialisation against the generic build, then time both."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dynshape_perception.core.runtime.executable import LoadedModel
from dynshape_perception.core.runtime.shapes import DimPolicy, Padding, Signature
from dynshape_perception.errors import ValidationError
from dynshape_perception.models.common import ModelDef


@dataclass(frozen=True)
class CompileRequest:
    """Everything a compile worker needs: picklable, so a spawned process can take it."""

    model: str
    profile: str
    key: Signature
    cache_root: str
    weak_edges: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # A recorded call of the key; None skips validation (the dispatcher then refuses it).
    sample: Sequence[np.ndarray] | None = None
    rtol: float = 1e-4
    atol: float = 1e-5
    repeats: int = 5


@dataclass(frozen=True)
class CompileResult:
    path: str
    compile_s: float
    # Specialised / generic time on the recorded call, measured interleaved in the worker.
    speedup: float


def validate(
    model: ModelDef,
    generic: LoadedModel,
    special: LoadedModel,
    request: CompileRequest,
) -> float:
    """Every assumption of the key, then outputs and time against the generic build.

    Returns specialised / generic time; raises ``ValidationError`` on any mismatch.
    """
    key = request.key
    if request.sample is None:
        raise ValidationError(f"{key}: no recorded call to validate against")
    if special.model.name != model.name:
        raise ValidationError(f"{key}: library is for {special.model.name}, not {model.name}")
    args = list(request.sample)
    function = key.function
    spec = model.spec.function(function)
    dims = model.spec.bind_dims(function, args)
    policy = DimPolicy(dict(request.weak_edges)).for_function(spec)
    if not policy.admits(key, Signature.of(function, dims)):
        raise ValidationError(f"recorded call {dims} is outside the guard of {key}")
    padding = Padding(spec, dims, key.as_dict())

    def served() -> list[np.ndarray]:
        # As a hit runs, for the check and for the timing: padding and cropping cost a call of
        # tens of microseconds a share of it, which timing the padded call alone would miss.
        if padding.identity:
            return special.run_unchecked(function, args)
        return padding.crop(special.run_unchecked(function, padding.pad(args)))

    for arr, tspec in zip(padding.pad(args), spec.inputs, strict=True):
        want = tuple(tspec.resolve(key.as_dict()))
        if tuple(arr.shape) != want:
            raise ValidationError(f"padded {tspec.name} is {arr.shape}, {key} wants {want}")
    got = served()
    ref = generic.run_unchecked(function, args)
    for g, r in zip(got, ref, strict=True):
        if g.shape != r.shape or not np.allclose(g, r, rtol=request.rtol, atol=request.atol):
            raise ValidationError(f"{key}: specialised outputs differ from the generic build")
    return _interleaved_ratio(
        served, lambda: generic.run_unchecked(function, args), request.repeats
    )


def _interleaved_ratio(
    special: Callable[[], object], generic: Callable[[], object], n: int
) -> float:
    """Best of ``n`` each, alternating, so that a burst of load hits both sides alike."""
    best_s = best_g = float("inf")
    for _ in range(max(1, n)):
        t0 = time.perf_counter()
        special()
        t1 = time.perf_counter()
        generic()
        t2 = time.perf_counter()
        best_s, best_g = min(best_s, t1 - t0), min(best_g, t2 - t1)
    return best_s / max(best_g, 1e-9)
