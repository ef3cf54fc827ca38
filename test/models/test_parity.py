"""Each model's TVM output equals its NumPy twin at every count, from one compiled library."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from dynshape_perception.compiler.cache import ArtefactCache
from dynshape_perception.compiler.targets import load_profile
from dynshape_perception.errors import ShapeError
from dynshape_perception.models import MODEL_NAMES, model_definition
from dynshape_perception.models.common import ModelDef
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import init_weights
from dynshape_perception.runtime.executable import LoadedModel
from dynshape_perception.runtime.shapes import sample_inputs

RTOL, ATOL = 1e-4, 1e-5
# 17 is a full row tile and one row more; from 49 rows the dense decoder head runs in parallel.
COUNTS = (0, 1, 2, 7, 17, 49, 64, 1000)


def counts_for(bound: int) -> list[int]:
    return sorted({c for c in COUNTS if c <= bound} | {bound})


def dims_for(model: ModelDef, count: int) -> dict[str, int] | None:
    """All symbolic dims at ``count`` (capped at each bound), or None if none reaches it."""
    dims = {d: min(count, model.spec.bounds[d]) for d in model.spec.dims}
    if model.name == "predictor" and dims["A"] > 0:
        dims["T"] = max(dims["T"], 1)
    return dims


def packed_matches_padded(runner: LoadedModel, seed: int) -> None:
    rng = np.random.default_rng(seed)
    lengths = rng.integers(1, 40, size=13).astype(np.int32)
    padded = np.zeros((13, int(lengths.max()), 2), np.float32)
    rows = []
    for a, n in enumerate(lengths):
        walk = np.cumsum(rng.normal(0, 0.5, size=(n, 2)), axis=0).astype(np.float32)
        padded[a, :n] = walk
        rows.append(walk)
    packed = runner("encode_packed", np.concatenate(rows), lengths)
    full = runner("encode", padded, lengths)
    for p, f in zip(packed, full, strict=True):
        np.testing.assert_allclose(p, f, rtol=RTOL, atol=ATOL)


class Compiled:
    def __init__(self, name: str, root: Path) -> None:
        self.model = model_definition(name)
        self.weights = init_weights(parameter_shapes(self.model), seed=3)
        self.cache = ArtefactCache(root)
        artefact = self.cache.get_or_build(self.model, self.weights, load_profile("x86_64"))
        self.runner = LoadedModel(self.model, artefact.library_path)


@pytest.fixture(scope="module", params=MODEL_NAMES)
def compiled(request: pytest.FixtureRequest, cache_root: Path) -> Compiled:
    return Compiled(request.param, cache_root)


def test_every_count_matches_numpy_with_one_library(compiled: Compiled) -> None:
    model = compiled.model
    all_counts = sorted({c for d in model.spec.dims for c in counts_for(model.spec.bounds[d])})
    misses_before = compiled.cache.misses
    for fn in model.spec.functions:
        for count in all_counts:
            dims = dims_for(model, count)
            assert dims is not None
            inputs = sample_inputs(model, fn.name, dims, seed=count)
            got = compiled.runner(fn.name, *inputs)
            want = model.reference(fn.name, compiled.weights, inputs)
            assert len(got) == len(want) == len(fn.outputs)
            for g, w in zip(got, want, strict=True):
                assert g.shape == w.shape, (fn.name, dims)
                np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"{fn.name} {dims}")
    assert compiled.cache.misses == misses_before, "a count triggered a recompile"


def test_bound_plus_one_is_rejected(compiled: Compiled) -> None:
    model = compiled.model
    for fn in model.spec.functions:
        for dim in model.spec.dims:
            if not any(dim in t.shape for t in fn.inputs):
                continue
            dims = {d: 1 for d in model.spec.dims}
            dims[dim] = model.spec.bounds[dim] + 1
            if dim == "A" and "S" in dims:
                dims["S"] = dims["A"]
            inputs = sample_inputs(model, fn.name, dims)
            with pytest.raises(ShapeError, match=f"{dim}={dims[dim]}, above its bound"):
                compiled.runner(fn.name, *inputs)


def test_zero_counts_give_empty_outputs(compiled: Compiled) -> None:
    model = compiled.model
    fn = model.spec.functions[0]
    dims = {d: 0 for d in model.spec.dims}
    outputs = compiled.runner(fn.name, *sample_inputs(model, fn.name, dims))
    for out, shape in zip(outputs, fn.outputs, strict=True):
        expected = tuple(0 if isinstance(d, str) else d for d in shape)
        assert out.shape == expected


def test_predictor_step_t_times_equals_full_sequence(cache_root: Path) -> None:
    compiled = Compiled("predictor", cache_root)
    rng = np.random.default_rng(11)
    agents, steps = 9, 128
    walk = np.cumsum(rng.normal(0.0, 0.4, size=(agents, steps, 2)), axis=1).astype(np.float32)
    lengths = np.full(agents, steps, np.int32)
    full = compiled.runner("encode", walk, lengths)
    hidden, pos, disp = compiled.runner("encode", walk[:, :1].copy(), np.ones(agents, np.int32))
    for t in range(1, steps):
        hidden, pos, disp = compiled.runner("step", hidden, pos, disp, walk[:, t].copy())
    for inc, ref in zip((hidden, pos, disp), full, strict=True):
        np.testing.assert_allclose(inc, ref, rtol=RTOL, atol=ATOL)
    packed_matches_padded(compiled.runner, seed=5)
    traj_inc = compiled.runner("decode", hidden, pos, disp)
    traj_full = compiled.runner("forward", walk, lengths)
    for a, b in zip(traj_inc, traj_full, strict=True):
        np.testing.assert_allclose(a, b, rtol=RTOL, atol=ATOL)


def test_predictor_step_decode_equals_step_then_decode(cache_root: Path) -> None:
    """The fused per-frame entry of incremental prediction is ``step`` followed by ``decode``."""
    compiled = Compiled("predictor", cache_root)
    rng = np.random.default_rng(12)
    for agents in (0, 1, 5, 64):
        walk = np.cumsum(rng.normal(0.0, 0.4, size=(agents, 6, 2)), axis=1).astype(np.float32)
        state = compiled.runner("encode", walk[:, :5].copy(), np.full(agents, 5, np.int32))
        new_pos = walk[:, 5].copy()
        fused = compiled.runner("step_decode", *state, new_pos)
        stepped = compiled.runner("step", *state, new_pos)
        want = [*stepped, *compiled.runner("decode", *stepped)]
        assert len(fused) == len(want) == 5
        for got, ref in zip(fused, want, strict=True):
            assert got.shape == ref.shape
            np.testing.assert_allclose(got, ref, rtol=RTOL, atol=ATOL)
