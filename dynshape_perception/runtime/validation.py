"""Phase one of the switch: check a specialisation against the generic build, then time both."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial

import numpy as np

from dynshape_perception.errors import ValidationError
from dynshape_perception.models.common import ModelDef
from dynshape_perception.runtime.executable import LoadedModel
from dynshape_perception.runtime.shapes import DimPolicy, Padding, Signature

MAX_TIMED_PAIRS = 1000


@dataclass(frozen=True)
class CompileRequest:
    """Everything a compile worker needs: picklable, so a spawned process can take it."""

    model: str
    profile: str
    key: Signature
    cache_root: str
    # The bound on the cache root's bytes on disk that this compile's store keeps.
    cache_max_bytes: int | None = None
    weak_edges: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    # A recorded call of the key; None skips validation (the dispatcher then refuses it).
    sample: Sequence[np.ndarray] | None = None
    rtol: float = 1e-4
    atol: float = 1e-5
    # Timed pairs: at least ``repeats``, more while ``timing_s`` lasts (see _interleaved_ratio).
    repeats: int = 5
    timing_s: float = 0.05


@dataclass(frozen=True)
class CompileResult:
    path: str
    compile_s: float
    # Specialised / generic time on the recorded call, measured interleaved in the worker.
    speedup: float
    # Fetched from the artefact cache, not built: its time is no estimate of a compile's.
    cache_hit: bool = False
    # Entries the store evicted from the cache root to keep its bound on disk.
    disk_evictions: int = 0


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
    target = key.as_dict()
    padding = Padding(spec, dims, target)

    def served() -> list[np.ndarray]:
        # As a hit runs, for the check and for the timing: padding and cropping cost a call of
        # tens of microseconds a share of it, which timing the padded call alone would miss.
        return padding.around(partial(special.run_unchecked, function), args)

    for arr, tspec in zip(padding.pad(args), spec.inputs, strict=True):
        want = tuple(tspec.resolve(target))
        if tuple(arr.shape) != want:
            raise ValidationError(f"padded {tspec.name} is {arr.shape}, {key} wants {want}")
    got = served()
    ref = generic.run_unchecked(function, args)
    for g, r in zip(got, ref, strict=True):
        if g.shape != r.shape or not np.allclose(g, r, rtol=request.rtol, atol=request.atol):
            raise ValidationError(f"{key}: specialised outputs differ from the generic build")
    return _interleaved_ratio(
        served, lambda: generic.run_unchecked(function, args), request.repeats, request.timing_s
    )


def _interleaved_ratio(
    special: Callable[[], object],
    generic: Callable[[], object],
    n: int,
    budget_s: float,
    clock: Callable[[], float] = time.perf_counter,
) -> float:
    """Best of each side over at least ``n`` alternating pairs, and as many more as fit in
    ``budget_s``: a burst of load hits both sides alike.

    Five pairs time a call of milliseconds well, not one of microseconds: the best of five
    pairs of a small predictor key spreads wider than a key's distance from the acceptance
    ratio, so five pairs could accept or reject it by chance, where the best of hundreds
    holds still. Small calls fit hundreds of pairs in the budget, and the first verdict on
    a function steers its cost model.
    """
    best_s = best_g = float("inf")
    started = clock()
    pairs = 0
    while pairs < max(1, n) or (pairs < MAX_TIMED_PAIRS and clock() - started < budget_s):
        t0 = clock()
        special()
        t1 = clock()
        generic()
        t2 = clock()
        best_s, best_g = min(best_s, t1 - t0), min(best_g, t2 - t1)
        pairs += 1
    return best_s / max(best_g, 1e-9)
