"""Padding that makes a bucket exact: the fast edge pad equals np.pad's edge mode."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dynshape_perception.compiler.tvm_adapter import TENSOR_ALIGNMENT
from dynshape_perception.models import model_definition
from dynshape_perception.models.common import FunctionSpec, TensorSpec
from dynshape_perception.runtime.policy import JitConfig
from dynshape_perception.runtime.shapes import (
    DimPolicy,
    Padding,
    Signature,
)

PRED = model_definition("predictor")
SEG = model_definition("segmenter")
# Predictor calls of A agents and T steps, and how far their key grows each.
GROWN_HISTORIES = dict(
    a=st.integers(1, 6),
    t=st.integers(1, 6),
    extra_a=st.integers(0, 3),
    extra_t=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)


@settings(max_examples=200, deadline=None)
@given(
    shape=st.lists(st.integers(1, 5), min_size=1, max_size=4),
    extra=st.lists(st.integers(0, 4), min_size=4, max_size=4),
    seed=st.integers(0, 2**16),
)
def test_edge_padding_equals_numpy_edge_mode(shape: list[int], extra: list[int], seed: int) -> None:
    arr = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    dims = tuple(f"d{i}" for i in range(len(shape)))
    spec = FunctionSpec("f", (TensorSpec("x", dims),))
    actual = dict(zip(dims, shape, strict=True))
    target = {d: n + e for d, n, e in zip(dims, shape, extra, strict=False)}
    want = np.pad(arr, [(0, target[d] - n) for d, n in zip(dims, shape, strict=True)], "edge")
    (got,) = Padding(spec, actual, target).pad([arr])
    assert got.dtype == arr.dtype and got.shape == want.shape
    np.testing.assert_array_equal(got, want)


def test_a_grown_plan_pads_only_the_axes_that_grow() -> None:
    spec = PRED.spec.function("forward")
    history = np.ones((3, 5, 2), np.float32)
    lengths = np.full(3, 5, np.int32)
    hist, lens = Padding(spec, {"A": 3, "T": 5}, {"A": 4, "T": 8}).pad([history, lengths])
    assert hist.shape == (4, 8, 2) and lens.tolist() == [5, 5, 5, 1]
    assert hist.sum() == history.sum()
    hist, lens = Padding(spec, {"A": 3, "T": 5}, {"A": 3, "T": 8}).pad([history, lengths])
    assert hist.shape == (3, 8, 2) and lens is lengths


@settings(max_examples=100, deadline=None)
@given(**GROWN_HISTORIES)
def test_declared_pad_values_fill_every_grown_axis_at_once(
    a: int, t: int, extra_a: int, extra_t: int, seed: int
) -> None:
    """Histories pad with 0 and lengths with 1: a padded agent then runs no GRU step."""
    spec = PRED.spec.function("forward")
    rng = np.random.default_rng(seed)
    history = rng.standard_normal((a, t, 2)).astype(np.float32)
    lengths = rng.integers(1, t + 1, a).astype(np.int32)
    target = {"A": a + extra_a, "T": t + extra_t}
    hist, lens = Padding(spec, {"A": a, "T": t}, target).pad([history, lengths])
    assert hist.shape == (a + extra_a, t + extra_t, 2) and hist.dtype == np.float32
    assert lens.shape == (a + extra_a,) and lens.dtype == np.int32
    np.testing.assert_array_equal(hist[:a, :t], history)
    assert not hist[a:].any() and not hist[:, t:].any()
    np.testing.assert_array_equal(lens, [*lengths, *[1] * extra_a])


@settings(max_examples=100, deadline=None)
@given(**GROWN_HISTORIES)
def test_a_padding_plan_pads_and_crops_every_call_of_its_signature_alike(
    a: int, t: int, extra_a: int, extra_t: int, seed: int
) -> None:
    """Planned once from the dims, a plan keeps no state from one call to the next."""
    spec = PRED.spec.function("forward")
    dims, target = {"A": a, "T": t}, {"A": a + extra_a, "T": t + extra_t}
    plan = Padding(spec, dims, target)
    assert plan.identity == (extra_a == extra_t == 0)
    rng = np.random.default_rng(seed)
    for _ in range(3):
        history = rng.standard_normal((a, t, 2)).astype(np.float32)
        lengths = rng.integers(1, t + 1, a).astype(np.int32)
        hist, lens = plan.pad([history, lengths])
        np.testing.assert_array_equal(hist, np.pad(history, [(0, extra_a), (0, extra_t), (0, 0)]))
        np.testing.assert_array_equal(lens, np.pad(lengths, (0, extra_a), constant_values=1))
        assert hist.dtype == np.float32 and lens.dtype == np.int32
        outputs = [
            rng.standard_normal(
                tuple(target[d] if isinstance(d, str) else d for d in shape)
            ).astype(np.float32)
            for shape in spec.outputs
        ]
        for got, full, shape in zip(plan.crop(outputs), outputs, spec.outputs, strict=True):
            cut = tuple(slice(0, dims[d]) if isinstance(d, str) else slice(None) for d in shape)
            want = full[cut]
            assert got.flags.c_contiguous
            np.testing.assert_array_equal(got, want)


def test_an_identity_plan_hands_the_arrays_through() -> None:
    spec = PRED.spec.function("forward")
    plan = Padding(spec, {"A": 3, "T": 5}, {"A": 3, "T": 5})
    history, lengths = np.zeros((3, 5, 2), np.float32), np.ones(3, np.int32)
    assert plan.identity
    padded = plan.pad([history, lengths])
    assert padded[0] is history and padded[1] is lengths
    outputs = [np.zeros((3, 6, 12, 2), np.float32), np.zeros((3, 6), np.float32)]
    assert all(g is o for g, o in zip(plan.crop(outputs), outputs, strict=True))


@pytest.mark.parametrize("points", [1, 5000, 60_001])
def test_edge_padded_clouds_are_aligned_for_the_vm(points: int) -> None:
    """The VM copies an unaligned array: a padded cloud must not be copied twice."""
    spec = SEG.spec.function("forward")
    cloud = np.random.default_rng(points).standard_normal((points, 4)).astype(np.float32)
    ground = np.zeros(4, np.float32)
    padded, same = Padding(spec, {"P": points}, {"P": points + 7}).pad([cloud, ground])
    assert padded.ctypes.data % TENSOR_ALIGNMENT == 0
    assert padded.shape == (points + 7, 4) and padded.dtype == np.float32
    np.testing.assert_array_equal(padded, np.pad(cloud, [(0, 7), (0, 0)], "edge"))
    assert same is ground


def test_short_histories_and_few_agents_specialise_exactly_by_default() -> None:
    """Padding one agent or a few history steps costs a small call more than a
    specialisation saves, so the default edges keep them exact."""
    policy = JitConfig().dim_policy(PRED.spec)
    for a in (1, 2, 3, 4):
        for t in range(1, 9):
            sig = Signature.of("forward", {"A": a, "T": t})
            assert policy.key(sig) == sig
    assert policy.key(Signature.of("forward", {"A": 5, "T": 9})) == Signature.of(
        "forward", {"A": 6, "T": 12}
    )


def test_packed_dims_stay_strong_per_function() -> None:
    policy = DimPolicy({"A": (2, 4, 8), "T": (8, 16), "S": (64,)})
    packed = policy.for_function(PRED.spec.function("encode_packed"))
    assert dict(packed.weak_edges) == {"T": (8, 16)}
    sig = Signature.of("encode_packed", {"A": 3, "S": 17})
    assert packed.key(sig) == sig, "padding cannot keep packed lengths summing to S"
    padded = policy.for_function(PRED.spec.function("forward"))
    assert padded.key(Signature.of("forward", {"A": 3, "T": 5})) == Signature.of(
        "forward", {"A": 4, "T": 8}
    )


@settings(max_examples=100, deadline=None)
@given(a=st.integers(1, 6), t=st.integers(1, 9), extra_a=st.integers(0, 3), seed=st.integers(0, 99))
def test_crop_undoes_pad_and_returns_dense_arrays(a: int, t: int, extra_a: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    spec = PRED.spec.function("encode")
    padded_dims = {"A": a + extra_a, "T": t}
    outputs = [
        rng.standard_normal(
            tuple(padded_dims[d] if isinstance(d, str) else d for d in shape)
        ).astype(np.float32)
        for shape in spec.outputs
    ]
    got = Padding(spec, {"A": a, "T": t}, padded_dims).crop(outputs)
    for full, cut in zip(outputs, got, strict=True):
        np.testing.assert_array_equal(cut, full[:a])
        assert cut.flags.c_contiguous


def test_crop_past_the_leading_axis_copies_to_a_dense_array() -> None:
    spec = FunctionSpec("f", (TensorSpec("x", ("A", "T")),), (("A", "T"),))
    out = np.arange(4 * 6, dtype=np.float32).reshape(4, 6)
    (cut,) = Padding(spec, {"A": 3, "T": 2}, {"A": 4, "T": 6}).crop([out])
    np.testing.assert_array_equal(cut, out[:3, :2])
    assert cut.flags.c_contiguous


def test_a_signature_is_rehashed_where_it_is_unpickled() -> None:
    sig = Signature.of("forward", {"A": 3, "T": 5})
    assert hash(sig) == hash(Signature.of("forward", {"T": 5, "A": 3}))
    # As if pickled in a process whose string hashes differ from this one's.
    object.__setattr__(sig, "_hash", 12345)
    back = pickle.loads(pickle.dumps(sig))
    assert back == sig and hash(back) == hash(("forward", (("A", 3), ("T", 5))))
    assert {back: 1}[Signature.of("forward", {"A": 3, "T": 5})] == 1


def test_edges_past_a_bound_are_cut_back_to_it() -> None:
    policy = DimPolicy({"T": (8, 32, 128), "A": (2, 4)})
    clipped = policy.within({"T": 100, "A": 64})
    assert clipped.weak_edges == {"T": (8, 32, 100), "A": (2, 4)}
    assert clipped.bucket("T", 97) == 100 and clipped.bucket("T", 20) == 32
    assert policy.within({"T": 5}).weak_edges["T"] == (5,)
    assert policy.within({"T": 128}).weak_edges == policy.weak_edges
    assert policy.within({}).weak_edges == policy.weak_edges
