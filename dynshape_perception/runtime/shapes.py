"""Shape signatures, strong/weak dims, bucket guards, and the padding that makes buckets exact."""

from __future__ import annotations

import bisect
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from dynshape_perception.compiler.tvm_adapter import aligned_empty
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
        # Zero stays exact: padding an empty input would invent rows that are not there.
        if not edges or value == 0:
            return value
        i = bisect.bisect_left(edges, value)
        return edges[i] if i < len(edges) else value

    def within(self, bounds: Mapping[str, int]) -> DimPolicy:
        """Edges past a dim's bound cut back to the bound: no call exceeds it, a key above it
        cannot be built (builds check bounds), and padding up to it would be waste."""
        clipped: dict[str, tuple[int, ...]] = {}
        for dim, edges in self.weak_edges.items():
            bound = bounds.get(dim)
            if bound is None or edges[-1] <= bound:
                clipped[dim] = edges
            else:
                clipped[dim] = (*(e for e in edges if e < bound), int(bound))
        return DimPolicy(clipped)

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


class Padding:
    """How a signature's arrays reach its key's shapes and back, worked out once.

    A hit on a small predictor key saves a few microseconds; finding which axes grow by
    walking the specs on every call costs more than that. Built with a signature's first
    hit, the plan leaves a call only the copies it makes.

    Inputs pad up to ``target`` with their ``pad`` value where the model declares one, else by
    repeating the last slice. Repeating real rows keeps padding exact for every model here:
    points, affinity rows and agents are independent, and padded rows are cropped away. A
    declared value must be as exact: history steps past an agent's length are
    never read, and a padded agent of length 1 is independent too, only cheaper. Callers
    never pad an axis of length 0.
    """

    __slots__ = ("_crops", "_edges", "_fills", "identity")

    def __init__(
        self, spec: FunctionSpec, actual: Mapping[str, int], target: Mapping[str, int]
    ) -> None:
        fills: list[tuple[int, tuple[int, ...], float, tuple[slice, ...]]] = []
        edges: list[tuple[int, tuple[tuple[int, int], ...]]] = []
        for i, tspec in enumerate(spec.inputs):
            have = tuple(int(actual[d]) if isinstance(d, str) else int(d) for d in tspec.shape)
            if tspec.pad is not None:
                full = tuple(
                    max(target[d], n) if isinstance(d, str) else n
                    for d, n in zip(tspec.shape, have, strict=True)
                )
                if full != have:
                    fills.append((i, full, tspec.pad, tuple(slice(0, n) for n in have)))
                continue
            steps = tuple(
                (axis, target[d])
                for axis, d in enumerate(tspec.shape)
                if isinstance(d, str) and target[d] > have[axis]
            )
            if steps:
                edges.append((i, steps))
        crops: list[tuple[int, tuple[slice, ...]]] = []
        for i, shape in enumerate(spec.outputs):
            if any(isinstance(d, str) and target[d] > actual[d] for d in shape):
                cut = tuple(
                    slice(0, actual[d]) if isinstance(d, str) else slice(None) for d in shape
                )
                crops.append((i, cut))
        self._fills = tuple(fills)
        self._edges = tuple(edges)
        self._crops = tuple(crops)
        self.identity = not fills and not edges and not crops

    def pad(self, arrays: Sequence[np.ndarray]) -> list[np.ndarray]:
        out = list(arrays)
        for i, full, value, region in self._fills:
            grown = np.full(full, value, out[i].dtype)
            grown[region] = out[i]
            out[i] = grown
        for i, steps in self._edges:
            for axis, m in steps:
                out[i] = _pad_axis(out[i], axis, m)
        return out

    def around(
        self, run: Callable[[list[np.ndarray]], list[np.ndarray]], arrays: Sequence[np.ndarray]
    ) -> list[np.ndarray]:
        """``run`` on the padded arrays, its outputs cropped; as is where nothing grows."""
        if self.identity:
            return run(list(arrays))
        return self.crop(run(self.pad(arrays)))

    def crop(self, outputs: Sequence[np.ndarray]) -> list[np.ndarray]:
        """Padded outputs cut back to the call's dims, dense as an unpadded call's."""
        out = list(outputs)
        for i, cut in self._crops:
            arr = out[i][cut]
            # A cut past axis 0 leaves a strided view; callers get dense arrays, as unpadded.
            out[i] = arr if arr.flags.c_contiguous else np.ascontiguousarray(arr)
        return out


def _pad_axis(arr: np.ndarray, axis: int, m: int) -> np.ndarray:
    """One axis edge-padded to ``m``, as ``np.pad(mode="edge")`` does, without its overhead.

    Padding axes one after another, in order, repeats the corner element into the corners,
    as np.pad does; the padded axis has length >= 1. The array is aligned for the VM, which
    would copy a cloud again otherwise; the small declared-value fills skip that, as finding
    an address costs more than copying a few rows.
    """
    n = arr.shape[axis]
    out = aligned_empty((*arr.shape[:axis], m, *arr.shape[axis + 1 :]), arr.dtype)
    lead = (slice(None),) * axis
    out[(*lead, slice(0, n))] = arr
    out[(*lead, slice(n, m))] = arr[(*lead, slice(n - 1, n))]
    return out


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
