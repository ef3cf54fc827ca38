"""Shape signatures, strong/weak dims, bucket guards, and the padding that makes buckets exact."""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dynshape_perception.errors import ConfigError
from dynshape_perception.models.common import FunctionSpec, ModelDef


@dataclass(frozen=True, order=True, slots=True)
class Signature:
    """A function and its symbolic dims' values, in a canonical order."""

    function: str
    dims: tuple[tuple[str, int], ...]
    # A key of several tables on every call: hashed once here, not as nested tuples each time.
    _hash: int = field(init=False, repr=False, compare=False, default=0)

    def __post_init__(self) -> None:
        object.__setattr__(self, "_hash", hash((self.function, self.dims)))

    def __hash__(self) -> int:
        return self._hash

    def __reduce__(self) -> tuple[type[Signature], tuple[str, tuple[tuple[str, int], ...]]]:
        # String hashes differ between processes: a compile worker must rehash, not copy.
        return (Signature, (self.function, self.dims))

    @classmethod
    def of(cls, function: str, dims: Mapping[str, int]) -> Signature:
        return cls(function, tuple(sorted((k, int(v)) for k, v in dims.items())))

    def as_dict(self) -> dict[str, int]:
        return dict(self.dims)

    def __str__(self) -> str:
        return f"{self.function}(" + ", ".join(f"{k}={v}" for k, v in self.dims) + ")"


@dataclass(frozen=True)
class DimPolicy:
    """Strong dims specialise exactly; weak dims round up to bucket edges and are padded."""

    weak_edges: Mapping[str, tuple[int, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for dim, edges in self.weak_edges.items():
            if not edges or list(edges) != sorted(set(edges)) or edges[0] < 1:
                raise ConfigError(f"bucket edges of {dim} must be increasing positive ints")

    def bucket(self, dim: str, value: int) -> int:
        """The value a specialisation of ``value`` is built for."""
        edges = self.weak_edges.get(dim)
        # Zero stays exact: padding an empty input would invent data (e.g. a pooled feature).
        if not edges or value == 0:
            return value
        i = bisect.bisect_left(edges, value)
        return edges[i] if i < len(edges) else value

    def for_function(self, spec: FunctionSpec) -> DimPolicy:
        """The policy for one entry point: dims tied to packed lengths stay strong.

        Padding repeats the last slice, which keeps padded agents and rows independent, but
        it cannot keep packed lengths summing to the padded row count.
        """
        tied: set[str] = set()
        for tspec in spec.inputs:
            if tspec.sums_to is not None:
                tied.add(tspec.sums_to)
                tied.update(d for d in tspec.shape if isinstance(d, str))
        if not tied & set(self.weak_edges):
            return self
        return DimPolicy({d: e for d, e in self.weak_edges.items() if d not in tied})

    def key(self, signature: Signature) -> Signature:
        return Signature(
            signature.function, tuple((d, self.bucket(d, v)) for d, v in signature.dims)
        )

    def admits(self, key: Signature, signature: Signature) -> bool:
        """The guard: may the specialisation built for ``key`` serve ``signature``?"""
        if key.function != signature.function or len(key.dims) != len(signature.dims):
            return False
        for (kd, kv), (sd, sv) in zip(key.dims, signature.dims, strict=True):
            if kd != sd or self.bucket(sd, sv) != kv or sv > kv:
                return False
        return True


def pad_inputs(
    spec: FunctionSpec, arrays: Sequence[np.ndarray], target: Mapping[str, int]
) -> list[np.ndarray]:
    """Pad every symbolic axis up to ``target``: with the input's ``pad`` value where the
    model declares one, else by repeating its last slice.

    Repeating real rows keeps padding exact for every model here: duplicated points leave a
    max-pool unchanged, and affinity rows and agents are independent. A declared value must
    be as exact: history steps past an agent's length are never read, and a padded agent of
    length 1 is independent too, only cheaper. Callers never pad an axis of length 0.
    """
    out: list[np.ndarray] = []
    for arr, tspec in zip(arrays, spec.inputs, strict=True):
        if tspec.pad is not None:
            arr = _fill_to(arr, tspec.shape, target, tspec.pad)
        else:
            for axis, dim in enumerate(tspec.shape):
                if isinstance(dim, str) and target[dim] > arr.shape[axis]:
                    arr = _pad_axis(arr, axis, target[dim])
        out.append(arr)
    return out


def _fill_to(
    arr: np.ndarray, dims: Sequence[object], target: Mapping[str, int], value: float
) -> np.ndarray:
    """``arr`` grown to ``target`` on its symbolic axes, the new cells ``value``: one fill and
    one copy however many axes grow; ``arr`` itself if none does."""
    full = tuple(
        max(target[d], n) if isinstance(d, str) else n for d, n in zip(dims, arr.shape, strict=True)
    )
    if full == arr.shape:
        return arr
    out = np.full(full, value, arr.dtype)
    out[tuple(slice(0, n) for n in arr.shape)] = arr
    return out


def _pad_axis(arr: np.ndarray, axis: int, m: int) -> np.ndarray:
    """One axis edge-padded to ``m``, as ``np.pad(mode="edge")`` does, in a tenth of its time.

    A hit pads on the calling path, where np.pad alone would cost more than a specialised
    predictor call saves. Padding axes one after another, in order, repeats the corner
    element into the corners, as np.pad does; the padded axis has length >= 1.
    """
    n = arr.shape[axis]
    out = np.empty((*arr.shape[:axis], m, *arr.shape[axis + 1 :]), arr.dtype)
    lead = (slice(None),) * axis
    out[(*lead, slice(0, n))] = arr
    out[(*lead, slice(n, m))] = arr[(*lead, slice(n - 1, n))]
    return out


def crop_outputs(
    spec: FunctionSpec, outputs: Sequence[np.ndarray], actual: Mapping[str, int]
) -> list[np.ndarray]:
    """Cut padded outputs back to the call's real dims."""
    cropped: list[np.ndarray] = []
    for arr, shape in zip(outputs, spec.outputs, strict=True):
        for axis, dim in enumerate(shape):
            if isinstance(dim, str) and arr.shape[axis] > actual[dim]:
                arr = arr[(slice(None),) * axis + (slice(0, actual[dim]),)]
        # A cut past axis 0 leaves a strided view; callers get dense arrays, as unpadded.
        cropped.append(arr if arr.flags.c_contiguous else np.ascontiguousarray(arr))
    return cropped


def sample_inputs(
    model: ModelDef, function: str, dims: Mapping[str, int], seed: int = 0
) -> list[np.ndarray]:
    """Valid synthetic inputs of the given dims (for validating a specialisation)."""
    rng = np.random.default_rng(seed)
    out: list[np.ndarray] = []
    for tspec in model.spec.function(function).inputs:
        shape = tuple(int(d) for d in tspec.resolve(dims))
        if tspec.sums_to is not None:
            out.append(_composition(rng, int(dims[tspec.sums_to]), shape[0]).astype(tspec.dtype))
        elif tspec.count_of is not None:
            high = max(1, int(dims.get(tspec.count_of, 1)))
            out.append(rng.integers(1, high + 1, size=shape).astype(tspec.dtype))
        else:
            out.append(rng.standard_normal(shape).astype(tspec.dtype))
    return out


def _composition(rng: np.random.Generator, total: int, parts: int) -> np.ndarray:
    """``parts`` positive ints summing to ``total`` (all ones when total == parts)."""
    if parts == 0:
        return np.zeros(0, np.int64)
    if total < parts:
        raise ValueError(f"cannot split {total} rows into {parts} positive lengths")
    cuts = np.sort(rng.choice(np.arange(1, total), size=parts - 1, replace=False))
    return np.diff(np.concatenate([[0], cuts, [total]]))
