"""Shared model pieces: the symbolic-dim spec, a pre-transposed dense layer, the definition."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from tvm.relax.frontend import nn
from tvm.relax.frontend.nn import op

from dynshape_perception.errors import InputValueError, ShapeError

Dim = int | str


@dataclass(frozen=True)
class TensorSpec:
    """One input: a shape of fixed ints and named symbolic dims, and a dtype."""

    name: str
    shape: tuple[Dim, ...]
    dtype: str = "float32"
    finite: bool = True
    # For integer inputs that count along a dim (valid lengths): values lie in [1, dim].
    count_of: str | None = None
    # For lengths of packed rows: values are >= 1 and sum to this dim.
    sums_to: str | None = None
    # The value padding fills in when a bucket pads this input; None repeats its last slice.
    pad: float | None = None

    def resolve(self, dims: Mapping[str, int] | None) -> tuple[Dim, ...]:
        if not dims:
            return self.shape
        return tuple(dims.get(d, d) if isinstance(d, str) else d for d in self.shape)


@dataclass(frozen=True)
class FunctionSpec:
    """An entry point: its inputs and the shapes of its outputs, in the same named dims."""

    name: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[tuple[Dim, ...], ...] = ()


@dataclass(frozen=True)
class ModelSpec:
    """The named symbolic dims of a model, their bounds, and its entry points."""

    model: str
    dims: tuple[str, ...]
    functions: tuple[FunctionSpec, ...]
    bounds: Mapping[str, int] = field(default_factory=dict)
    # How calls batch: a dim named here is padded up to its next edge, so one specialisation
    # serves every count up to it; other dims specialise exactly. The JIT config may override.
    bucket_edges: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def function(self, name: str) -> FunctionSpec:
        for fn in self.functions:
            if fn.name == name:
                return fn
        raise KeyError(f"{self.model} has no function {name!r}")

    def tvm_spec(
        self, dims: Mapping[str, int] | None = None, functions: Sequence[str] | None = None
    ) -> dict[str, dict[str, Any]]:
        """The ``export_tvm`` spec; ``dims`` pins symbolic dims to ints (a specialisation) and
        ``functions`` keeps only those entry points (a specialisation serves one function)."""
        if functions is not None:
            unknown = set(functions) - {fn.name for fn in self.functions}
            if unknown or not functions:
                raise ShapeError(f"{self.model} has no functions {sorted(unknown)}")
        return {
            fn.name: {t.name: nn.spec.Tensor(list(t.resolve(dims)), t.dtype) for t in fn.inputs}
            for fn in self.functions
            if functions is None or fn.name in functions
        }

    def check_signature(self, function: str, dims: Mapping[str, int]) -> str | None:
        """Why ``dims`` cannot be a call of ``function`` (names, bounds), or None if it can."""
        fn = next((f for f in self.functions if f.name == function), None)
        if fn is None:
            return f"{self.model} has no function {function!r}"
        names = {d for t in fn.inputs for d in t.shape if isinstance(d, str)}
        if set(dims) != names:
            return f"{self.model}.{function} has dims {sorted(names)}, not {sorted(dims)}"
        for dim, value in dims.items():
            bound = self.bounds.get(dim)
            if value < 0 or (bound is not None and value > bound):
                return f"{dim}={value} lies outside [0, {bound}]"
        for tspec in fn.inputs:
            if tspec.sums_to is None:
                continue
            # Packed lengths are each at least 1: no call splits fewer rows than that.
            parts = tspec.shape[0]
            count = dims[parts] if isinstance(parts, str) else parts
            if count > dims[tspec.sums_to]:
                return f"{tspec.sums_to}={dims[tspec.sums_to]} rows cannot hold {count} lengths"
        return None

    def bind_dims(self, function: str, arrays: list[np.ndarray]) -> dict[str, int]:
        """Validate ``arrays`` against ``function``'s inputs; return the symbolic dims' values."""
        fn = self.function(function)
        if len(arrays) != len(fn.inputs):
            raise ShapeError(
                f"{self.model}.{function} takes {len(fn.inputs)} tensors, got {len(arrays)}"
            )
        values: dict[str, int] = {}
        for arr, spec in zip(arrays, fn.inputs, strict=True):
            expected = _shape_text(spec.shape)
            if not isinstance(arr, np.ndarray):
                raise ShapeError(f"{spec.name} must be a numpy array {expected}, got {type(arr)}")
            # A mask hides NaN from the finiteness check, and the kernels ignore it anyway.
            if isinstance(arr, np.ma.MaskedArray):
                raise ShapeError(f"{spec.name} is a masked array: pass plain values")
            if arr.ndim != len(spec.shape):
                raise ShapeError(
                    f"{spec.name} has rank {arr.ndim}, expected {expected} {spec.dtype}"
                )
            if arr.dtype != np.dtype(spec.dtype):
                raise ShapeError(
                    f"{spec.name} has dtype {arr.dtype}, expected {expected} {spec.dtype}"
                )
            for axis, (got, want) in enumerate(zip(arr.shape, spec.shape, strict=True)):
                if isinstance(want, int):
                    if got != want:
                        raise ShapeError(
                            f"{spec.name} has width {got} on axis {axis}, expected {expected}"
                        )
                    continue
                if values.setdefault(want, got) != got:
                    raise ShapeError(
                        f"{spec.name} has {want}={got} on axis {axis}, but another input "
                        f"has {want}={values[want]}"
                    )
                bound = self.bounds.get(want)
                if bound is not None and got > bound:
                    raise ShapeError(
                        f"{spec.name} has {want}={got}, above its bound {bound} "
                        f"(expected {expected})"
                    )
            if spec.finite and arr.size and not np.isfinite(arr).all():
                raise InputValueError(f"{spec.name} holds NaN or Inf values")
        return values

    def check_values(
        self, function: str, arrays: list[np.ndarray], dims: Mapping[str, int]
    ) -> None:
        """The value rules the inputs' specs state (``count_of``, ``sums_to``), on arrays whose
        shapes ``bind_dims`` bound to ``dims``."""
        for arr, spec in zip(arrays, self.function(function).inputs, strict=True):
            if not arr.size:
                continue
            if spec.count_of is not None:
                top = dims[spec.count_of]
                low, high = int(arr.min()), int(arr.max())
                if low < 1 or high > top:
                    raise InputValueError(
                        f"{spec.name} must lie in [1, {spec.count_of}={top}], got [{low}, {high}]"
                    )
            if spec.sums_to is not None:
                if int(arr.min()) < 1:
                    raise InputValueError(f"packed {spec.name} must be >= 1, got {int(arr.min())}")
                total = int(arr.astype(np.int64).sum())
                if total != dims[spec.sums_to]:
                    raise InputValueError(
                        f"packed {spec.name} sum to {total}, but the rows are "
                        f"{spec.sums_to}={dims[spec.sums_to]}"
                    )


@functools.cache
def _shape_text(shape: tuple[Dim, ...]) -> str:
    return "[" + ", ".join(str(d) for d in shape) + "]"


class Dense(nn.Module):
    """``x @ weight + bias`` with ``weight`` stored [in, out], so no per-call transpose exists."""

    def __init__(self, in_features: int, out_features: int) -> None:
        self.weight = nn.Parameter((in_features, out_features), "float32")
        self.bias = nn.Parameter((out_features,), "float32")

    def forward(self, x: nn.Tensor) -> nn.Tensor:
        return op.matmul(x, self.weight) + self.bias


def dense_ref(x: np.ndarray, weights: Mapping[str, np.ndarray], prefix: str) -> np.ndarray:
    out: np.ndarray = x @ weights[f"{prefix}.weight"] + weights[f"{prefix}.bias"]
    return out


def relu(x: np.ndarray) -> np.ndarray:
    out: np.ndarray = np.maximum(x, np.float32(0))
    return out


def sigmoid(x: np.ndarray) -> np.ndarray:
    # exp of -|x| only: the textbook form overflows (and warns) for large negative x.
    e = np.exp(-np.abs(x))
    out: np.ndarray = np.where(x >= 0, 1.0 / (1.0 + e), e / (1.0 + e)).astype(np.float32)
    return out


@dataclass(frozen=True)
class ModelDef:
    """What the compiler and runtime need to know about one model."""

    name: str
    version: str
    build_module: Callable[[bool], nn.Module]  # argument: build for a GPU target
    spec: ModelSpec
    reference: Callable[[str, Mapping[str, np.ndarray], list[np.ndarray]], list[np.ndarray]]
    config: Any
