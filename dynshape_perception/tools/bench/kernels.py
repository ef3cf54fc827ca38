"""``bench kernels``: TVM's generic builds against ONNX Runtime, PyTorch, torch.compile, NumPy."""

from __future__ import annotations

import argparse
import functools
import gc
import json
import logging
import math
import os
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeAlias

from dynshape_perception.errors import DynshapeError

if TYPE_CHECKING:
    import numpy as np

log = logging.getLogger(__name__)

THREADS = 2
# Passive pools: interleaved peers must not spin on the cores the next one runs on.
THREAD_ENV = {
    "OMP_WAIT_POLICY": "PASSIVE",
    "OMP_NUM_THREADS": str(THREADS),
    "MKL_NUM_THREADS": str(THREADS),
    "TVM_NUM_THREADS": str(THREADS),
    "TVM_THREAD_POOL_SPIN_COUNT": "0",
    # TVM pins its workers to cores by default; on a shared machine a pinned worker waits for
    # its core and stalls the whole parallel region (milliseconds, seen here).
    "TVM_BIND_THREADS": "0",
    "OPENBLAS_NUM_THREADS": str(THREADS),
    # OpenBLAS workers otherwise busy-wait about 2^28 cycles after each call.
    "OPENBLAS_THREAD_TIMEOUT": "4",
}
SIZES: dict[str, list[dict[str, int]]] = {
    "segmenter": [{"P": p} for p in (1000, 17238, 35000, 120000)],
    "associator": [{"N": n, "M": n} for n in (1, 8, 32, 128)],
    "predictor": [{"A": a, "T": t} for a in (1, 8, 32, 64) for t in (2, 8, 20)],
}
# A few small sizes for ``--smoke``, none an export size: a dim the export kept static fails.
SMOKE_SIZES: dict[str, list[dict[str, int]]] = {
    "segmenter": [{"P": 1}, {"P": 1000}],
    "associator": [{"N": 1, "M": 1}, {"N": 5, "M": 9}],
    "predictor": [{"A": 1, "T": 2}, {"A": 6, "T": 9}],
}
# Example shapes for export: none is 1, so no axis is specialised away.
EXPORT_SIZES = {
    "segmenter": {"P": 64},
    "associator": {"N": 3, "M": 4},
    "predictor": {"A": 3, "T": 5},
}
# After export, ORT runs the model at each dim grown by this many against the module it was
# exported from: a tracer that recorded a dim as a constant fails here, by name.
EXPORT_PROBE_GROWTH = 7
BACKENDS = ("tvm", "ort", "torch", "inductor", "numpy")
PEERS = ("ort", "torch", "inductor")
# Peers compute in float32 with other summation orders (and ORT fuses differently).
RTOL, ATOL = 1e-3, 1e-4
# The gate applies where the fastest peer needs at least this long; below it, call overhead
# decides and the sizes are reported only.
GATE_MS = 1.0
OVERHEAD_CALLS = 2000

Call: TypeAlias = "Callable[[], list[np.ndarray]]"


class BenchError(DynshapeError):
    """A peer disagrees with TVM, or a benchmark extra is missing."""


@dataclass
class Row:
    model: str
    size: dict[str, int]
    ms: dict[str, float]
    # Per peer (and NumPy): the largest |output - TVM's output| at this size.
    max_abs_diff: dict[str, float] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "size": self.size,
            **{f"{b}_ms": round(self.ms[b], 4) for b in BACKENDS},
            "max_abs_diff": {k: float(f"{v:.3g}") for k, v in self.max_abs_diff.items()},
        }


@dataclass
class InductorStats:
    """Seconds of the calls that compiled, and graphs compiled after each model's first."""

    compile_s: float = 0.0
    recompiles: int = 0


@dataclass
class Report:
    rows: list[Row] = field(default_factory=list)
    overhead_us: float | None = None
    overhead_detail: dict[str, float] = field(default_factory=dict)
    inductor: InductorStats = field(default_factory=InductorStats)
    # Small sizes and few runs: every peer checked against TVM, no timing worth a figure.
    smoke: bool = False

    def as_json(self) -> dict[str, Any]:
        return {
            "smoke": self.smoke,
            "rows": [r.as_json() for r in self.rows],
            "overhead_us": None if self.overhead_us is None else round(self.overhead_us, 2),
            "inductor": {
                "compile_s": round(self.inductor.compile_s, 2),
                "recompiles": self.inductor.recompiles,
            },
        }


def prepare_environment() -> None:
    """Thread settings; they must be in place before NumPy (its OpenBLAS pool), torch, ONNX
    Runtime or TVM's pool start, so this module imports none of them at load time."""
    late = [m for m in ("numpy", "torch", "onnxruntime") if m in sys.modules]
    if late:
        log.warning("%s imported before the bench set its thread pools", ", ".join(late))
    for key, value in THREAD_ENV.items():
        os.environ.setdefault(key, value)


def make_inputs(model: str, size: Mapping[str, int], seed: int) -> list[np.ndarray]:
    """Plausible inputs: a lidar-like cloud, feature rows, walks with valid lengths."""
    import numpy as np

    rng = np.random.default_rng(seed)
    if model == "segmenter":
        p = size["P"]
        xy = rng.uniform(-50.0, 50.0, (p, 2))
        z = rng.uniform(-2.0, 3.0, (p, 1))
        intensity = rng.uniform(0.0, 1.0, (p, 1))
        points = np.concatenate([xy, z, intensity], axis=1).astype(np.float32)
        return [points, np.array([0.01, -0.02, 0.999, 1.7], np.float32)]
    if model == "associator":
        return [
            rng.normal(0.0, 1.0, (size["N"], 8)).astype(np.float32),
            rng.normal(0.0, 1.0, (size["M"], 8)).astype(np.float32),
        ]
    a, t = size["A"], size["T"]
    walk = np.cumsum(rng.normal(0.0, 0.4, (a, t, 2)), axis=1).astype(np.float32)
    return [walk, rng.integers(1, t + 1, a).astype(np.int32)]


def model_weights(name: str) -> tuple[Any, dict[str, np.ndarray], str]:
    """Committed weights when present, else the deterministic initial ones (speed is the same)."""
    from dynshape_perception.errors import WeightsError
    from dynshape_perception.models import model_definition
    from dynshape_perception.models.registry import committed_weights, parameter_shapes
    from dynshape_perception.models.weights import init_weights

    try:
        model, weights = committed_weights(name)
        return model, weights, "committed"
    except WeightsError:
        model = model_definition(name)
        return model, init_weights(parameter_shapes(model), seed=0), "initial"


class TvmBackend:
    """The generic symbolic build from the artefact cache, called the way the runtime calls it."""

    def __init__(
        self, model: Any, weights: Mapping[str, np.ndarray], cache_dir: Path | None
    ) -> None:
        from dynshape_perception.compiler import tvm_adapter as tvmx
        from dynshape_perception.compiler.cache import ArtefactCache
        from dynshape_perception.compiler.targets import load_profile
        from dynshape_perception.runtime.executable import LoadedModel

        artefact = ArtefactCache(cache_dir).get_or_build(model, weights, load_profile("x86_64"))
        self.library_path = artefact.library_path
        self.runner = LoadedModel(model, artefact.library_path)
        self.tvmx = tvmx
        vm = tvmx.make_vm(tvmx.load_library(artefact.library_path), tvmx.cpu_device())
        self.function = tvmx.vm_function(vm, "forward")

    def call(self, inputs: list[np.ndarray]) -> Call:
        """NumPy in, NumPy out through DLPack views, as torch.from_numpy / .numpy() do for the
        PyTorch peers; ``measure_overhead`` also times the same path through ``LoadedModel``."""
        tvmx, function = self.tvmx, self.function
        return lambda: tvmx.to_numpy_views(function(*(tvmx.to_tensor_view(a) for a in inputs)))


class TorchBackends:
    """PyTorch eager, torch.compile(dynamic=True) and an ONNX Runtime session of one model."""

    def __init__(
        self, name: str, model: Any, weights: Mapping[str, np.ndarray], work: Path
    ) -> None:
        import torch

        # tools.fit pins torch to portable single-threaded kernels for bit-reproducible fits,
        # only when torch is not loaded yet; here torch is loaded first, on purpose.
        fit_log = logging.getLogger("dynshape_perception.tools.fit.torch_env")
        level = fit_log.level
        fit_log.setLevel(logging.ERROR)
        try:
            from dynshape_perception.tools.fit import torch_models
        finally:
            fit_log.setLevel(level)

        self.torch = torch
        torch.set_num_threads(THREADS)
        # Compile in this process: a pool of compile workers would keep running next to the
        # timed calls that follow a recompile.
        torch._inductor.config.compile_threads = 1
        classes = {
            "segmenter": torch_models.Segmenter,
            "associator": torch_models.Associator,
            "predictor": torch_models.Predictor,
        }
        self.module = classes[name](model.config).eval()
        torch_models.load_numpy(self.module, weights)
        self.compiled = torch.compile(self.module, dynamic=True)
        self.session = _ort_session(name, self.module, model.config, weights, work)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.name = name

    def _tensors(self, inputs: list[np.ndarray]) -> list[Any]:
        return [self.torch.from_numpy(a) for a in inputs]

    def _outputs(self, out: Any) -> list[np.ndarray]:
        if isinstance(out, tuple | list):
            return [o.numpy() for o in out]
        return [out.numpy()]

    def eager(self, inputs: list[np.ndarray]) -> Call:
        def run() -> list[np.ndarray]:
            with self.torch.inference_mode():
                return self._outputs(self.module(*self._tensors(inputs)))

        return run

    def inductor(self, inputs: list[np.ndarray]) -> Call:
        def run() -> list[np.ndarray]:
            with self.torch.inference_mode():
                return self._outputs(self.compiled(*self._tensors(inputs)))

        return run

    def ort(self, inputs: list[np.ndarray]) -> Call:
        feed = dict(zip(self.input_names, inputs, strict=True))
        return lambda: list(self.session.run(None, feed))


def _ort_session(
    name: str, module: Any, config: Any, weights: Mapping[str, np.ndarray], work: Path
) -> Any:
    """Export with dynamic axes (the legacy exporter: it keeps TorchScript loops) and load."""
    import onnxruntime as ort
    import torch

    spec: dict[str, tuple[list[str], list[str], dict[str, dict[int, str]]]] = {
        "segmenter": (["points", "ground"], ["scores"], {"points": {0: "P"}}),
        "associator": (
            ["detections", "tracks"],
            ["affinity"],
            {"detections": {0: "N"}, "tracks": {0: "M"}, "affinity": {0: "N", 1: "M"}},
        ),
        "predictor": (
            ["history", "lengths"],
            ["trajectories", "probabilities"],
            {"history": {0: "A", 1: "T"}, "lengths": {0: "A"}},
        ),
    }
    inputs, outputs, axes = spec[name]
    exported = module
    if name == "segmenter":
        axes = {**axes, "scores": {0: "P"}}
        from dynshape_perception.tools.bench.torch_graphs import traceable_segmenter

        exported = traceable_segmenter(config, weights)
    if name == "predictor":
        axes = {**axes, "trajectories": {0: "A"}, "probabilities": {0: "A"}}
        from dynshape_perception.tools.bench.torch_graphs import scripted_predictor

        exported = scripted_predictor(config, weights)
    args = tuple(torch.from_numpy(a) for a in make_inputs(name, EXPORT_SIZES[name], seed=0))
    path = work / f"{name}.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            exported,
            args,
            str(path),
            dynamo=False,
            input_names=inputs,
            output_names=outputs,
            dynamic_axes=axes,
        )
    options = ort.SessionOptions()
    options.intra_op_num_threads = THREADS
    options.inter_op_num_threads = 1
    options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    session = ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])
    check_export(name, module, session, inputs)
    return session


def check_export(name: str, module: Any, session: Any, input_names: list[str]) -> None:
    """ORT at sizes other than the export's against the module: a dim traced as static fails."""
    import torch

    size = {dim: value + EXPORT_PROBE_GROWTH for dim, value in EXPORT_SIZES[name].items()}
    arrays = make_inputs(name, size, seed=1)
    try:
        got = list(session.run(None, dict(zip(input_names, arrays, strict=True))))
    except Exception as err:  # ORT raises its own types (Fail, InvalidArgument, ...)
        raise BenchError(
            f"the ONNX export of the {name} kept a dynamic dim static: ORT fails at {size} "
            f"after export at {EXPORT_SIZES[name]} ({err})"
        ) from err
    with torch.inference_mode():
        out = module(*(torch.from_numpy(a) for a in arrays))
    want = [o.numpy() for o in out] if isinstance(out, tuple | list) else [out.numpy()]
    _check_close(name, size, "ORT", got, want, reference="the exported module")


def _check_close(
    model: str,
    size: Mapping[str, int],
    name: str,
    got: list[np.ndarray],
    want: list[np.ndarray],
    reference: str = "TVM",
) -> float:
    """The largest |got - want| over the outputs; a BenchError past the tolerance."""
    import numpy as np

    where = f"{model} {dict(size)}: {name}"
    if len(got) != len(want):
        raise BenchError(f"{where} gave {len(got)} outputs, {reference} {len(want)}")
    worst = 0.0
    for g, w in zip(got, want, strict=True):
        if g.shape != w.shape:
            raise BenchError(f"{where} gave shape {g.shape}, {reference} {w.shape}")
        err = float(np.max(np.abs(g - w))) if g.size else 0.0
        if not np.allclose(g, w, rtol=RTOL, atol=ATOL):
            raise BenchError(f"{where} differs from {reference} (max |d| {err:.3g})")
        worst = max(worst, err)
    return worst


def _dynamo_graphs(torch: Any) -> int:
    counters = torch._dynamo.utils.counters
    return int(counters["stats"]["unique_graphs"])


def time_interleaved(calls: Mapping[str, Call], runs: int) -> dict[str, float]:
    """Median milliseconds per backend, one call of each per round, the order rotated; the
    garbage collector is off while timing, as in ``timeit``, so no call pays for another's."""
    samples: dict[str, list[float]] = {name: [] for name in calls}
    names = list(calls)
    gc.collect()
    gc.disable()
    try:
        for i in range(runs):
            for name in names[i % len(names) :] + names[: i % len(names)]:
                start = time.perf_counter()
                calls[name]()
                samples[name].append((time.perf_counter() - start) * 1e3)
    finally:
        gc.enable()
    return {name: statistics.median(values) for name, values in samples.items()}


def bench_model(
    name: str,
    runs: int,
    warmup: int,
    cache_dir: Path | None,
    work: Path,
    report: Report,
    sizes: Sequence[Mapping[str, int]],
) -> None:
    model, weights, source = model_weights(name)
    log.info("%s: %s weights", name, source)
    tvm = TvmBackend(model, weights, cache_dir)
    peers = TorchBackends(name, model, weights, work)
    torch = peers.torch
    for size in sizes:
        inputs = make_inputs(name, size, seed=sum(size.values()))
        calls: dict[str, Call] = {
            "tvm": tvm.call(inputs),
            "ort": peers.ort(inputs),
            "torch": peers.eager(inputs),
            "inductor": peers.inductor(inputs),
            "numpy": functools.partial(model.reference, "forward", weights, inputs),
        }
        want = calls["tvm"]()
        graphs = _dynamo_graphs(torch)
        start = time.perf_counter()
        first = calls["inductor"]()
        compiled = _dynamo_graphs(torch) - graphs
        if compiled:
            report.inductor.compile_s += time.perf_counter() - start
            report.inductor.recompiles += compiled if size is not sizes[0] else compiled - 1
        diffs = {b: _check_close(name, size, b, calls[b](), want) for b in ("ort", "torch")}
        diffs["inductor"] = _check_close(name, size, "inductor", first, want)
        diffs["numpy"] = _check_close(name, size, "numpy", calls["numpy"](), want)
        for _ in range(warmup):
            for call in calls.values():
                call()
        row = Row(name, dict(size), time_interleaved(calls, runs), diffs)
        report.rows.append(row)
        print(_format_row(row), flush=True)
    if name == "associator":
        report.overhead_detail = measure_overhead(tvm, make_inputs(name, {"N": 1, "M": 1}, 0))
        report.overhead_us = report.overhead_detail["dlpack_in_out_us"]


def measure_overhead(tvm: TvmBackend, inputs: list[np.ndarray]) -> dict[str, float]:
    """Microseconds of one VM call at the smallest shapes: the bare call with tensors already on
    the device, and the full NumPy-in, NumPy-out path the runtime takes."""
    from dynshape_perception.compiler import tvm_adapter as tvmx

    runner, function = tvm.runner, tvm.function
    tensors = [tvmx.to_tensor(a) for a in inputs]

    def per_call(fn: Callable[[], Any]) -> float:
        rounds = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(OVERHEAD_CALLS):
                fn()
            rounds.append((time.perf_counter() - start) / OVERHEAD_CALLS * 1e6)
        return min(rounds)

    return {
        "vm_call_us": per_call(lambda: function(*tensors)),
        "dlpack_in_out_us": per_call(tvm.call(inputs)),
        "loaded_model_us": per_call(lambda: runner.run_unchecked("forward", inputs)),
        "loaded_model_validated_us": per_call(lambda: runner("forward", *inputs)),
    }


def _format_size(size: Mapping[str, int]) -> str:
    return " ".join(f"{k}={v}" for k, v in size.items())


def _format_row(row: Row) -> str:
    ms = row.ms
    ratios = "".join(f"{ms[p] / ms['tvm']:>12.2f}x" for p in (*PEERS, "numpy"))
    times = "".join(f"{ms[b]:>13.3f}" for b in BACKENDS)
    return f"{row.model:<11}{_format_size(row.size):<14}{times}{ratios}"


def header() -> str:
    times = "".join(f"{b + '_ms':>13}" for b in BACKENDS)
    ratios = "".join(f"{'vs_' + p:>13}" for p in (*PEERS, "numpy"))
    return f"{'model':<11}{'size':<14}{times}{ratios}"


@dataclass(frozen=True)
class Verdict:
    gated: int
    gate_failures: list[str]
    geomean_vs_torch: float
    overhead_us: float | None

    def lines(self) -> list[str]:
        out = [
            f"gate (>= 1.0x the fastest peer where it takes >= {GATE_MS} ms): "
            f"{self.gated - len(self.gate_failures)}/{self.gated} sizes pass",
            *[f"  missed: {f}" for f in self.gate_failures],
            f"geometric mean vs PyTorch eager: {self.geomean_vs_torch:.2f}x (target >= 1.5x)",
            "VM call overhead: "
            + (
                "not measured (run the associator)"
                if self.overhead_us is None
                else f"{self.overhead_us:.1f} us (target <= 50 us)"
            ),
        ]
        return out


def verdict(report: Report) -> Verdict:
    gated, failures = 0, []
    for row in report.rows:
        best = min(PEERS, key=lambda p: row.ms[p])
        if row.ms[best] < GATE_MS:
            continue
        gated += 1
        ratio = row.ms[best] / row.ms["tvm"]
        if ratio < 1.0:
            failures.append(f"{row.model} {_format_size(row.size)}: {ratio:.2f}x {best}")
    logs = [math.log(r.ms["torch"] / r.ms["tvm"]) for r in report.rows]
    geomean = math.exp(sum(logs) / len(logs)) if logs else math.nan
    return Verdict(gated, failures, geomean, report.overhead_us)


def run_benchmark(
    models: Sequence[str], runs: int, warmup: int, cache_dir: Path | None, smoke: bool = False
) -> Report:
    prepare_environment()
    try:
        import onnxruntime  # noqa: F401
        import torch  # noqa: F401
    except ImportError as err:
        raise BenchError(
            f"bench kernels needs the benchmark extras: pip install -r requirements-bench.txt "
            f"({err})"
        ) from err
    report = Report(smoke=smoke)
    sizes = SMOKE_SIZES if smoke else SIZES
    print(header(), flush=True)
    with tempfile.TemporaryDirectory(prefix="dynshape-bench-kernels-") as tmp:
        for name in models:
            bench_model(name, runs, warmup, cache_dir, Path(tmp), report, sizes[name])
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=Path, default=None, help="write the results here")
    parser.add_argument(
        "--models", nargs="+", choices=tuple(SIZES), default=list(SIZES), help="models to run"
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=20,
        help="timed runs per backend and size, their median reported (>= 20; >= 1 with --smoke)",
    )
    parser.add_argument("--warmup", type=int, default=3, help="untimed runs after the checks")
    parser.add_argument(
        "--cache-dir", type=Path, default=None, help="artefact cache (default: the user cache)"
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="two small sizes per model, none the export's: checks every peer against TVM "
        "(for CI); its timings are no figures",
    )


def run(args: argparse.Namespace) -> int:
    if args.runs < (1 if args.smoke else 20):
        raise BenchError(
            "--runs must be >= 1"
            if args.smoke
            else "take the median of at least 20 runs (--runs >= 20)"
        )
    if args.warmup < 0:
        raise BenchError(f"--warmup must be >= 0, got {args.warmup}")
    report = run_benchmark(args.models, args.runs, args.warmup, args.cache_dir, args.smoke)
    result = verdict(report)
    print(
        f"inductor: compile {report.inductor.compile_s:.1f} s, "
        f"{report.inductor.recompiles} recompiles"
    )
    print("overhead: " + ", ".join(f"{k} {v:.1f}" for k, v in report.overhead_detail.items()))
    if args.smoke:
        print(f"smoke: every peer agreed with TVM at {len(report.rows)} sizes; no figures")
    else:
        for line in result.lines():
            print(line)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(report.as_json(), indent=2) + "\n")
    return 0
