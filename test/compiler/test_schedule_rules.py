"""CPU schedule rules: every kernel scheduled for symbolic and static shapes, same numbers, NEON."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from dynshape_perception.compiler import tvm_adapter as tvmx
from dynshape_perception.compiler.build import bound_module
from dynshape_perception.compiler.cache import ArtefactCache
from dynshape_perception.compiler.schedules import (
    CpuScheduleContext,
    apply_cpu_rules,
    context_for_target,
)
from dynshape_perception.compiler.schedules.templates import load_factory
from dynshape_perception.compiler.targets import load_profile
from dynshape_perception.config import default_bounds
from dynshape_perception.errors import CompileError
from dynshape_perception.models import MODEL_NAMES, model_definition, segmenter
from dynshape_perception.models.common import (
    Dense,
    FunctionSpec,
    ModelDef,
    ModelSpec,
    TensorSpec,
    dense_ref,
    relu,
)
from dynshape_perception.models.registry import parameter_shapes
from dynshape_perception.models.weights import init_weights
from dynshape_perception.runtime.executable import LoadedModel
from dynshape_perception.runtime.shapes import sample_inputs

RTOL, ATOL = 1e-4, 1e-5
# Static specialisations with ragged tails: 37 points is one full tile plus a partial one.
STATIC_DIMS = {
    "segmenter": {"P": 37},
    "associator": {"N": 3, "M": 5},
    "predictor": {"A": 5, "T": 7},
}
NEON = CpuScheduleContext(vector_lanes=4, register_rows=6, register_cols=16, isa="neon")
AVX2 = CpuScheduleContext(vector_lanes=8, register_rows=6, register_cols=16, isa="avx2")
GENERIC = CpuScheduleContext(vector_lanes=4, register_rows=6, register_cols=8, isa="generic")
AARCH64 = {"kind": "llvm", "mtriple": "aarch64-linux-gnu", "mattr": ["+neon"]}


def weights_for(model: ModelDef) -> dict[str, np.ndarray]:
    """Initial weights with non-zero biases, so a dropped bias shows."""
    rng = np.random.default_rng(5)
    weights = init_weights(parameter_shapes(model), seed=5)
    return {k: v + rng.normal(0.0, 0.1, v.shape).astype(np.float32) for k, v in weights.items()}


def scheduled(
    model: ModelDef, weights: Mapping[str, np.ndarray], ctx: CpuScheduleContext, dims: Any = None
) -> tuple[Any, dict[str, str], dict[str, str]]:
    target = load_profile("x86_64").target()
    mod, bounds = bound_module(model, weights, dims)
    mod = tvmx.lower_to_tir(tvmx.set_upper_bounds(mod, bounds), target)
    mod, report = apply_cpu_rules(mod, ctx)
    return mod, report.applied, report.skipped


@pytest.mark.parametrize("static", [False, True], ids=["symbolic", "static"])
@pytest.mark.parametrize("name", MODEL_NAMES)
def test_every_kernel_gets_a_rule_or_is_hand_scheduled(name: str, static: bool) -> None:
    model = model_definition(name)
    ctx = context_for_target(load_profile("x86_64").target())
    dims = STATIC_DIMS[name] if static else None
    _, applied, skipped = scheduled(model, weights_for(model), ctx, dims)
    assert applied
    assert set(skipped.values()) <= {"already scheduled"}, skipped


@pytest.mark.parametrize("name", MODEL_NAMES)
@pytest.mark.parametrize(
    "spec", [{"kind": "llvm", "mcpu": "x86-64-v3"}, AARCH64], ids=["x86-64-v3", "aarch64"]
)
def test_only_a_build_of_templates_and_hand_scheduled_kernels_is_shape_invariant(
    name: str, spec: dict[str, Any]
) -> None:
    """The segmenter is one template kernel: a static P changes its loop bounds' values only.
    The others have kernels whose rules choose by static extents."""
    model = model_definition(name)
    target = tvmx.make_target(spec)
    for dims in (None, STATIC_DIMS[name]):
        mod, bounds = bound_module(model, weights_for(model), dims)
        mod = tvmx.lower_to_tir(tvmx.set_upper_bounds(mod, bounds), target)
        _, report = apply_cpu_rules(mod, context_for_target(target))
        assert report.shape_invariant == (name == "segmenter"), (dims, report)


@pytest.mark.parametrize(
    ("spec", "isa", "predictor_rules"),
    [
        ({"kind": "llvm", "mcpu": "skylake-avx512"}, "avx512", {"dense", "matvec"}),
        ({"kind": "llvm", "mcpu": "rocketlake"}, "avx512", {"dense", "matvec"}),
        ({"kind": "llvm", "mcpu": "x86-64-v3"}, "avx2", {"dense", "matvec"}),
        ({"kind": "llvm", "mcpu": "x86-64"}, "generic", {"dense", "matvec"}),
        (AARCH64, "neon", {"dense", "matvec"}),
    ],
    ids=["skylake-avx512", "rocketlake", "x86-64-v3", "x86-64", "aarch64"],
)
def test_expected_rules_pick_the_models_kernels(
    spec: dict[str, Any], isa: str, predictor_rules: set[str]
) -> None:
    """Per explicit target, never the host's: the predictor's 6 logits fill under half of 16
    lanes, which makes them a matvec, and at least half of 8 or 4 lanes (dense); its single
    gate logit is a matvec everywhere, and its ranking is a hand-scheduled kernel."""
    target = tvmx.make_target(spec)
    ctx = context_for_target(target)
    assert ctx.isa == isa
    chosen: dict[str, set[str]] = {}
    for name in MODEL_NAMES:
        model = model_definition(name)
        mod, bounds = bound_module(model, weights_for(model))
        mod = tvmx.lower_to_tir(tvmx.set_upper_bounds(mod, bounds), target)
        chosen[name] = set(apply_cpu_rules(mod, ctx)[1].applied.values())
    assert chosen["segmenter"] == {f"template[{isa}]"}
    assert chosen["associator"] == {"dense", "matvec", "injective"}
    assert chosen["predictor"] == predictor_rules


@pytest.mark.parametrize(
    ("spec", "isa", "lanes"),
    [
        ({"kind": "llvm", "mcpu": "skylake-avx512"}, "avx512", 16),
        ({"kind": "llvm", "mcpu": "rocketlake"}, "avx512", 16),
        ({"kind": "llvm", "mcpu": "znver4"}, "avx512", 16),
        ({"kind": "llvm", "mcpu": "x86-64-v3"}, "avx2", 8),
        ({"kind": "llvm", "mcpu": "haswell"}, "avx2", 8),
        ({"kind": "llvm", "mcpu": "x86-64-v3", "mattr": ["+avx512f"]}, "avx512", 16),
        ({"kind": "llvm", "mcpu": "skylake-avx512", "mattr": ["-avx512f"]}, "avx2", 8),
        ({"kind": "llvm", "mcpu": "x86-64"}, "generic", 4),
        (AARCH64, "neon", 4),
        ({"kind": "llvm", "mtriple": "aarch64-linux-gnu"}, "neon", 4),
    ],
)
def test_the_isa_comes_from_the_features_llvm_reports(
    spec: dict[str, Any], isa: str, lanes: int
) -> None:
    """A CPU name the code never heard of still gets its registers' schedules, and ``mattr``
    switches features either way."""
    ctx = context_for_target(tvmx.make_target(spec))
    assert (ctx.isa, ctx.vector_lanes) == (isa, lanes)
    assert ctx.register_rows * ctx.register_cols * 4 < 1024


def test_features_of_a_non_llvm_target_are_a_compile_error() -> None:
    with pytest.raises(CompileError, match="llvm target"):
        tvmx.cpu_features(tvmx.make_target({"kind": "cuda", "arch": "sm_90"}))


@pytest.mark.parametrize("name", ["predictor", "associator"])
def test_symbolic_row_counts_split_at_the_last_whole_tile_match_numpy(
    name: str, cache_root: Path
) -> None:
    """Every row count from none to three tiles and a row, and either side of the count at
    which whole tiles turn parallel: the tiles, the rows after them and both twins."""
    model = model_definition(name)
    weights = weights_for(model)
    artefact = ArtefactCache(cache_root).get_or_build(model, weights, load_profile("x86_64"))
    runner = LoadedModel(model, artefact.library_path)
    if name == "predictor":
        dims = [{"A": a, "T": 3} for a in (*range(0, 50), 63, 64)]
    else:
        # Rows are N x M: around one tile, and around 2048 (where the tiles turn parallel).
        pairs = ((0, 5), (1, 1), (1, 15), (1, 16), (1, 17), (3, 11), (16, 127), (16, 128))
        dims = [{"N": n, "M": m} for n, m in (*pairs, (17, 121), (128, 128))]
    for d in dims:
        inputs = sample_inputs(model, "forward", d, seed=sum(d.values()))
        got = runner("forward", *inputs)
        for g, w in zip(got, model.reference("forward", weights, inputs), strict=True):
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"{d}")


class _OddShapes(nn.Module):
    """Matmuls the models lack: 17 outputs (no lane count divides it, and it is above the
    register budget), and a reduction over the row count itself (attention's P @ V)."""

    def __init__(self) -> None:
        self.head = Dense(24, 17)

    def forward(self, x: nn.Tensor, p: nn.Tensor, v: nn.Tensor) -> tuple[nn.Tensor, nn.Tensor]:
        return op.relu(self.head(x)), op.matmul(p, v)


def _odd_shapes_reference(
    function: str, weights: Mapping[str, np.ndarray], inputs: list[np.ndarray]
) -> list[np.ndarray]:
    x, p, v = inputs
    return [relu(dense_ref(x, weights, "head")), p @ v]


ODD_SHAPES = ModelDef(
    name="odd_shapes",
    version="1",
    build_module=lambda gpu: _OddShapes(),
    spec=ModelSpec(
        model="odd_shapes",
        dims=("N",),
        # Enough rows at the bound for P @ V's tiles to keep a parallel twin.
        bounds={"N": 2048},
        functions=(
            FunctionSpec(
                "forward",
                (
                    TensorSpec("x", ("N", 24)),
                    TensorSpec("p", ("N", "N")),
                    TensorSpec("v", ("N", 512)),
                ),
                (("N", 17), ("N", 512)),
            ),
        ),
    ),
    reference=_odd_shapes_reference,
    config=None,
)


@pytest.mark.parametrize("ctx", [None, NEON, AVX2], ids=["host", "neon-lanes", "avx2-lanes"])
def test_odd_matmuls_over_a_symbolic_row_count_build_and_match_numpy(
    ctx: CpuScheduleContext | None,
) -> None:
    """The rows after the last whole tile with a width no lane count divides (each column
    its own chunk), and a reduction whose extent is the row count, which every nest of the
    split kernel loops over."""
    ctx = ctx or context_for_target(load_profile("x86_64").target())
    weights = weights_for(ODD_SHAPES)
    mod, applied, _ = scheduled(ODD_SHAPES, weights, ctx)
    assert set(applied.values()) >= {"dense"}
    vm = tvmx.make_vm(tvmx.build(mod, load_profile("x86_64").target()), tvmx.cpu_device())
    forward = tvmx.vm_function(vm, "forward")
    # 1100 rows take P @ V's parallel twin.
    for count in (0, 1, 5, 16, 17, 40, 1100):
        inputs = sample_inputs(ODD_SHAPES, "forward", {"N": count}, seed=count)
        got = tvmx.to_numpy(forward(*(tvmx.to_tensor(a) for a in inputs)))
        for g, w in zip(got, ODD_SHAPES.reference("forward", weights, inputs), strict=True):
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=1e-4, err_msg=f"N={count}")


def test_segmenter_keeps_no_point_intermediate_in_memory() -> None:
    model = model_definition("segmenter")
    ctx = context_for_target(load_profile("x86_64").target())
    mod, _, _ = scheduled(model, weights_for(model), ctx)
    assert tvmx.planned_storage_bytes(mod) == {"forward": 0}


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_static_specialisation_matches_numpy(name: str, cache_root: Path) -> None:
    model = model_definition(name)
    weights = weights_for(model)
    dims = STATIC_DIMS[name]
    artefact = ArtefactCache(cache_root).get_or_build(
        model, weights, load_profile("x86_64"), dims=dims
    )
    runner = LoadedModel(model, artefact.library_path)
    inputs = sample_inputs(model, "forward", dims, seed=2)
    got = runner("forward", *inputs)
    for g, w in zip(got, model.reference("forward", weights, inputs), strict=True):
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"{dims}")


def static_forward(
    model: ModelDef, weights: Mapping[str, np.ndarray], ctx: CpuScheduleContext, dims: Any
) -> tuple[Any, dict[str, str], Any]:
    """The scheduled module of a static specialisation, the rules applied, and its forward."""
    mod, applied, _ = scheduled(model, weights, ctx, dims)
    vm = tvmx.make_vm(tvmx.build(mod, load_profile("x86_64").target()), tvmx.cpu_device())
    return mod, applied, tvmx.vm_function(vm, "forward")


STATIC_ROW_COUNTS = {
    "predictor": [{"A": a, "T": 3} for a in (1, 2, 3, 15, 16, 17, 33)],
    "associator": [{"N": n, "M": m} for n, m in ((1, 1), (1, 7), (3, 5), (16, 16), (17, 3))],
    "odd_shapes": [{"N": n} for n in (1, 5, 16, 17)],
}


@pytest.mark.parametrize("ctx", [None, NEON, AVX2], ids=["host", "neon-lanes", "avx2-lanes"])
@pytest.mark.parametrize("name", ["predictor", "associator", "odd_shapes"])
def test_static_row_counts_either_side_of_a_tile_match_numpy(
    name: str, ctx: CpuScheduleContext | None
) -> None:
    """Specialisations pin the row count: one row, fewer than a tile, a tile, a tile and a
    row. A count no tile divides is split at the last whole tile, as a symbolic one is."""
    ctx = ctx or context_for_target(load_profile("x86_64").target())
    model = ODD_SHAPES if name == "odd_shapes" else model_definition(name)
    weights = weights_for(model)
    for dims in STATIC_ROW_COUNTS[name]:
        _, applied, forward = static_forward(model, weights, ctx, dims)
        # A matmul rule that fails falls through to a generic rule, which would still match.
        # P @ V of one row reduces over one step: no reduction is left, only a copy.
        allowed = {"gemv", "dense", "matvec"} | ({"injective"} if dims == {"N": 1} else set())
        matmuls = {rule for kernel, rule in applied.items() if "matmul" in kernel}
        assert matmuls and matmuls <= allowed, (dims, applied)
        inputs = sample_inputs(model, "forward", dims, seed=3)
        got = tvmx.to_numpy(forward(*(tvmx.to_tensor(a) for a in inputs)))
        for g, w in zip(got, model.reference("forward", weights, inputs), strict=True):
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=1e-4, err_msg=f"{dims}")


def test_a_one_row_specialisation_runs_its_row_not_a_predicated_tile() -> None:
    """For one agent the analysis sees no row loop; the matvec rule then ran a 256-row tile
    under a predicate, scalarised: slower than the generic build."""
    ctx = context_for_target(load_profile("x86_64").target())
    model = model_definition("predictor")
    mod, applied, _ = scheduled(model, weights_for(model), ctx, {"A": 1, "T": 3})
    matmuls = {name for name in applied if "matmul" in name}
    assert matmuls and {applied[name] for name in matmuls} == {"gemv"}
    funcs = tvmx.prim_funcs(mod)
    for name in matmuls:
        text = funcs[name].script()
        assert "T.where" not in text and "T.parallel" not in text, name


def test_a_parallel_loop_of_one_iteration_is_never_worth_its_launch() -> None:
    ctx = context_for_target(load_profile("x86_64").target())
    assert not ctx.worth_parallel(1, ctx.min_parallel_work * 4)
    assert ctx.worth_parallel(2, ctx.min_parallel_work)


@pytest.mark.parametrize(
    "ctx", [NEON, AVX2, GENERIC], ids=["neon-blocking", "avx2-blocking", "generic-blocking"]
)
def test_other_targets_blocking_computes_the_same_on_this_host(ctx: CpuScheduleContext) -> None:
    """The NEON, AVX2 and generic register blockings, built for this host, give the reference
    numbers."""
    model = model_definition("segmenter")
    weights = weights_for(model)
    mod, applied, _ = scheduled(model, weights, ctx)
    assert applied == {"point_mlp": f"template[{ctx.isa}]"}
    vm = tvmx.make_vm(tvmx.build(mod, load_profile("x86_64").target()), tvmx.cpu_device())
    forward = tvmx.vm_function(vm, "forward")
    for count in (0, 1, 5, 41, 1000):
        inputs = sample_inputs(model, "forward", {"P": count}, seed=count)
        got = tvmx.to_numpy(forward(*(tvmx.to_tensor(a) for a in inputs)))
        for g, w in zip(got, model.reference("forward", weights, inputs), strict=True):
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"P={count}")


@pytest.mark.parametrize("ctx", [NEON, AVX2], ids=["neon-lanes", "avx2-lanes"])
@pytest.mark.parametrize("name", ["predictor", "associator"])
def test_other_targets_row_tiles_compute_the_same_on_this_host(
    name: str, ctx: CpuScheduleContext
) -> None:
    """The dense (and matvec) row tiles at 4 and 8 lanes, split at the last whole tile, give
    the reference numbers around their tile sizes."""
    model = model_definition(name)
    weights = weights_for(model)
    mod, applied, _ = scheduled(model, weights, ctx)
    # At 4 lanes the predictor's 6 logits are wide enough for the dense rule.
    assert "dense" in set(applied.values())
    vm = tvmx.make_vm(tvmx.build(mod, load_profile("x86_64").target()), tvmx.cpu_device())
    forward = tvmx.vm_function(vm, "forward")
    counts = (
        ({"A": a, "T": 2} for a in (1, 3, 4, 5, 8, 9, 17))
        if name == "predictor"
        else ({"N": n, "M": 3} for n in (1, 2, 3, 11))
    )
    for dims in counts:
        inputs = sample_inputs(model, "forward", dims, seed=7)
        got = tvmx.to_numpy(forward(*(tvmx.to_tensor(a) for a in inputs)))
        for g, w in zip(got, model.reference("forward", weights, inputs), strict=True):
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"{dims}")


@pytest.mark.parametrize(("mcpu", "register"), [("skylake-avx512", "zmm"), ("x86-64-v3", "ymm")])
def test_x86_builds_run_vector_fmas_in_their_registers(mcpu: str, register: str) -> None:
    """Compiled for explicit CPUs (the assembly is only read), never for the host's."""
    model = model_definition("segmenter")
    target = tvmx.make_target({"kind": "llvm", "mcpu": mcpu})
    mod, bounds = bound_module(model, weights_for(model))
    mod = tvmx.lower_to_tir(tvmx.set_upper_bounds(mod, bounds), target)
    mod, _ = apply_cpu_rules(mod, context_for_target(target))
    asm = tvmx.executable_source(tvmx.build(mod, target), "asm")
    assert any("vfmadd" in line and register in line for line in asm.splitlines())


@pytest.mark.parametrize("name", MODEL_NAMES)
def test_aarch64_neon_variant_compiles(name: str) -> None:
    profile = load_profile("aarch64")
    target = profile.target()
    ctx = context_for_target(target)
    assert (ctx.isa, ctx.vector_lanes) == ("neon", 4)
    model = model_definition(name)
    mod, bounds = bound_module(model, weights_for(model))
    mod = tvmx.lower_to_tir(tvmx.set_upper_bounds(mod, bounds), target)
    mod, report = apply_cpu_rules(mod, ctx)
    assert set(report.skipped.values()) <= {"already scheduled"}
    asm = tvmx.executable_source(tvmx.build(mod, target), "asm")
    if name == "segmenter":
        assert report.applied == {"point_mlp": "template[neon]"}
        assert any("fmla" in line and ".4s" in line for line in asm.splitlines())


def test_targets_choose_lanes_and_register_blocks() -> None:
    v3 = context_for_target(load_profile("x86_64-v3").target())
    assert (v3.isa, v3.vector_lanes) == ("avx2", 8)
    zen = context_for_target(tvmx.make_target({"kind": "llvm", "mcpu": "znver5"}))
    assert (zen.isa, zen.vector_lanes) == ("avx512", 16)
    for ctx in (v3, zen, NEON):
        assert ctx.register_rows * ctx.register_cols * 4 < 1024


def test_templates_only_load_package_factories() -> None:
    with pytest.raises(CompileError, match="not a dynshape_perception factory"):
        load_factory("os:system")


def test_fused_kernel_handles_widths_that_split_unevenly() -> None:
    """Hidden widths that are not multiples of the vector lanes still compute the reference."""
    config = segmenter.SegmenterConfig(hidden=(24, 40))
    model = segmenter.definition(default_bounds(), config)
    weights = weights_for(model)
    ctx = context_for_target(load_profile("x86_64").target())
    mod, _, _ = scheduled(model, weights, ctx)
    vm = tvmx.make_vm(tvmx.build(mod, load_profile("x86_64").target()), tvmx.cpu_device())
    forward = tvmx.vm_function(vm, "forward")
    for count in (1, 50):
        inputs = sample_inputs(model, "forward", {"P": count}, seed=count)
        got = tvmx.to_numpy(forward(*(tvmx.to_tensor(a) for a in inputs)))
        for g, w in zip(got, model.reference("forward", weights, inputs), strict=True):
            np.testing.assert_allclose(g, w, rtol=RTOL, atol=ATOL, err_msg=f"P={count}")
