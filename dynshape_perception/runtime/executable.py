"""A loaded model library behind input validation: the one way the core calls a TVM model."""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

from dynshape_perception.compiler import tvm_adapter as tvmx
from dynshape_perception.errors import ShapeError
from dynshape_perception.models.common import ModelDef


class LoadedModel:
    """Validates every call against the model spec, then runs it on the TVM VM."""

    def __init__(
        self,
        model: ModelDef,
        library: Path | Any,
        device: Any = None,
        functions: Sequence[str] | None = None,
    ) -> None:
        self.model = model
        self.device = device if device is not None else tvmx.cpu_device()
        self._on_cpu = device is None
        self.library_path = library if isinstance(library, Path) else None
        lib = tvmx.load_library(library) if isinstance(library, Path) else library
        self._vm = tvmx.make_vm(lib, self.device)
        # A specialisation holds only the function it was built for.
        names = functions if functions is not None else [fn.name for fn in model.spec.functions]
        self._functions = {name: tvmx.vm_function(self._vm, name) for name in names}
        # The Relax VM keeps per-call state; calls on one VM must not interleave.
        self._lock = threading.Lock()

    def validate(self, function: str, arrays: list[np.ndarray]) -> dict[str, int]:
        if function not in self._functions:
            raise ShapeError(f"{self.model.name} has no function {function!r}")
        dims = self.model.spec.bind_dims(function, arrays)
        self.model.spec.check_values(function, arrays, dims)
        return dims

    def __call__(self, function: str, *arrays: np.ndarray) -> list[np.ndarray]:
        args = list(arrays)
        self.validate(function, args)
        return self.run_unchecked(function, args)

    def run_unchecked(self, function: str, arrays: list[np.ndarray]) -> list[np.ndarray]:
        """Run without validation: for callers (the dispatcher) that validated already."""
        if not self._on_cpu:
            tensors = [tvmx.to_tensor(np.ascontiguousarray(a), self.device) for a in arrays]
            with self._lock:
                return tvmx.to_numpy(self._functions[function](*tensors))
        # Zero-copy DLPack views in and out: a copy each way costs more than a small call.
        views = [tvmx.to_tensor_view(a) for a in arrays]
        with self._lock:
            return tvmx.to_numpy_views(self._functions[function](*views))
