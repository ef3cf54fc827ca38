"""What every target check shares: the count set, generated inputs, weights, the tolerance rule."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from dynshape_perception.compiler import standalone_runner as runner
from dynshape_perception.compiler.standalone_runner import worst_error
from dynshape_perception.errors import DynshapeError
from dynshape_perception.models import MODEL_NAMES, model_definition
from dynshape_perception.models.common import ModelDef
from dynshape_perception.models.registry import committed_weights, parameter_shapes
from dynshape_perception.models.weights import init_weights, read_manifest
from dynshape_perception.runtime.shapes import sample_inputs

# The parity tests' counts; each symbolic dim is also checked at its bound.
PARITY_COUNTS = (0, 1, 2, 7, 64, 1000)
FALLBACK_SEED = 0


class VerifyError(DynshapeError):
    """A target check could not run (missing emulator, runner crash, unreadable artefact)."""


def repo_root() -> Path:
    """The source checkout (for .emu/ and scripts/), else the working directory."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "scripts").is_dir() else Path.cwd()


def parity_counts(bounds: Mapping[str, int]) -> list[int]:
    """The parity counts up to the largest bound, plus every bound."""
    top = max(bounds.values())
    return sorted({c for c in PARITY_COUNTS if c <= top} | set(bounds.values()))


def dims_for_count(count: int, bounds: Mapping[str, int]) -> dict[str, int]:
    """Every symbolic dim at ``count``, capped at its bound: (A, T) = (64, 128) at count 128.

    Capping keeps the dims consistent: a packed S never falls below its A, T >= 1 when A >= 1.
    """
    return {dim: min(count, bound) for dim, bound in bounds.items()}


@dataclass
class Case:
    """One call: a model function on generated inputs at one count."""

    model: str
    function: str
    count: int
    dims: dict[str, int]
    inputs: list[np.ndarray]
    expected: list[np.ndarray] = field(default_factory=list)

    @property
    def key(self) -> str:
        return f"{self.model}-{self.count}-{self.function}"


@dataclass(frozen=True)
class ModelUnderTest:
    model: ModelDef
    weights: dict[str, np.ndarray]
    weights_source: str


def load_model(name: str) -> ModelUnderTest:
    """Committed weights when the manifest has the model, else deterministic initial weights."""
    if name in read_manifest().get("models", {}):
        model, weights = committed_weights(name)
        return ModelUnderTest(model, weights, "committed (models/manifest.yaml)")
    model = model_definition(name)
    weights = init_weights(parameter_shapes(model), FALLBACK_SEED)
    return ModelUnderTest(model, weights, f"init_weights(seed={FALLBACK_SEED}): none committed")


def load_models(names: Sequence[str] = MODEL_NAMES) -> list[ModelUnderTest]:
    unknown = sorted(set(names) - set(MODEL_NAMES))
    if unknown:
        raise VerifyError(f"unknown models {unknown}; expected some of {', '.join(MODEL_NAMES)}")
    return [load_model(name) for name in names]


def make_cases(unit: ModelUnderTest, with_expected: bool = True) -> list[Case]:
    """Every function at every parity count (the parity tests' inputs), with NumPy outputs.

    A count that leaves a function's input shapes as an earlier count did (the predictor's
    history at counts above its bounds) adds no case for that function.
    """
    model = unit.model
    cases: list[Case] = []
    seen: set[tuple[str, tuple[tuple[int, ...], ...]]] = set()
    for count in parity_counts(model.spec.bounds):
        dims = dims_for_count(count, model.spec.bounds)
        for fn in model.spec.functions:
            shapes = tuple(tuple(int(d) for d in t.resolve(dims)) for t in fn.inputs)
            if (fn.name, shapes) in seen:
                continue
            seen.add((fn.name, shapes))
            inputs = sample_inputs(model, fn.name, dims, seed=count)
            model.spec.bind_dims(fn.name, inputs)
            expected = model.reference(fn.name, unit.weights, inputs) if with_expected else []
            cases.append(Case(model.name, fn.name, count, dims, inputs, list(expected)))
    return cases


@dataclass(frozen=True)
class Comparison:
    max_abs_diff: float
    ok: bool
    detail: str = ""


def compare(results: Sequence[np.ndarray], reference: Sequence[np.ndarray]) -> Comparison:
    """The runner's rule on every output: equal shapes, finite, within RTOL * max(1, |ref|)."""
    if len(results) != len(reference):
        return Comparison(float("inf"), False, f"{len(results)} outputs, expected {len(reference)}")
    worst_diff, worst_ratio = 0.0, 0.0
    for i, (got, want) in enumerate(zip(results, reference, strict=True)):
        try:
            diff, ratio = worst_error(np.asarray(got), np.asarray(want))
        except ValueError as err:
            return Comparison(float("inf"), False, f"output {i}: {err}")
        worst_diff, worst_ratio = max(worst_diff, diff), max(worst_ratio, ratio)
    return Comparison(worst_diff, worst_ratio <= 1.0)


def save_arrays(path: Path, arrays: Sequence[np.ndarray]) -> None:
    """Positional arrays (``arr_0, arr_1, ...``) in one .npz: the runner's exchange format."""
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, *[np.ascontiguousarray(a) for a in arrays])


def write_cases(
    cases: Sequence[Case], root: Path, layout: Mapping[str, str]
) -> list[dict[str, str | int]]:
    """Save each case's inputs and expected outputs under ``root``, at the ``inputs`` and
    ``expected`` paths of ``layout`` (``{key}`` is the case's); the runner's plan entries,
    which name every path of ``layout``."""
    entries: list[dict[str, str | int]] = []
    for case in cases:
        paths = {name: template.format(key=case.key) for name, template in layout.items()}
        save_arrays(root / paths["inputs"], case.inputs)
        save_arrays(root / paths["expected"], case.expected)
        entries.append({"key": case.key, "function": case.function, "count": case.count, **paths})
    return entries


def load_arrays(path: Path) -> list[np.ndarray]:
    try:
        return runner.load_arrays(path)
    except (OSError, ValueError, KeyError) as err:
        raise VerifyError(f"cannot read {path}: {err}") from err
