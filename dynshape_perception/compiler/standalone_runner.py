"""Stand-alone runner: load exported libraries with a runtime-only TVM, run saved cases, compare."""

# It runs where this package is absent (emulated aarch64, a vehicle, a GPU test machine), so it
# imports only the standard library, NumPy and TVM, and TVM only inside main().
from __future__ import annotations

import argparse
import ctypes
import json
import os
import platform
import sys
import time
import traceback
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

PLAN = "plan.json"
# Fail when any |result - reference| > RTOL * max(1, |reference|).
RTOL = 1e-4
CUDART = "libcudart.so.13"


def worst_error(got: np.ndarray, want: np.ndarray) -> tuple[float, float]:
    """(max |got - want|, max of |got - want| / (RTOL * max(1, |want|))); ValueError if unequal."""
    if got.shape != want.shape:
        raise ValueError(f"shape {got.shape} != expected {want.shape}")
    if not got.size:
        return 0.0, 0.0
    diff = np.abs(got.astype(np.float64) - want.astype(np.float64))
    if not np.isfinite(diff).all():
        raise ValueError("result is not finite where the reference is")
    scale = RTOL * np.maximum(1.0, np.abs(want.astype(np.float64)))
    return float(diff.max()), float((diff / scale).max())


def load_arrays(path: Path) -> list[np.ndarray]:
    with np.load(path) as npz:
        return [npz[f"arr_{i}"] for i in range(len(npz.files))]


def prepare_site(root: Path) -> None:
    """Put ``root/site`` first on sys.path, unpacking the wheels in ``root/wheels`` there once."""
    site = root / "site"
    wheels = root / "wheels"
    for wheel in sorted(wheels.glob("*.whl")) if wheels.is_dir() else []:
        stamp = site / f".{wheel.name}.unpacked"
        if not stamp.exists():
            with zipfile.ZipFile(wheel) as zf:
                zf.extractall(site)
            stamp.touch()
    if site.is_dir():
        sys.path.insert(0, str(site))


def preload_cudart() -> str:
    """Load libcudart.so.13 globally, from the loader's path or a CUDA or pip NVIDIA folder."""
    candidates = [CUDART]
    for base in (os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"):
        if base:
            candidates.append(str(Path(base) / "lib64" / CUDART))
    for entry in sys.path:
        for sub in ("nvidia/cu13/lib", "nvidia/cuda_runtime/lib"):
            candidates.append(str(Path(entry) / sub / CUDART))
    errors = []
    for cand in candidates:
        if cand != CUDART and not Path(cand).is_file():
            continue
        try:
            ctypes.CDLL(cand, mode=ctypes.RTLD_GLOBAL)
            return cand
        except OSError as err:
            errors.append(str(err))
    raise RuntimeError(f"cannot load {CUDART}: {'; '.join(errors) or 'not found'}")


def flatten(value: Any) -> list[np.ndarray]:
    if hasattr(value, "numpy"):
        return [value.numpy()]
    out: list[np.ndarray] = []
    for item in value:
        out.extend(flatten(item))
    return out


def _refuse_jit(source: str) -> bytes:
    raise RuntimeError("this library holds CUDA source, not device code: it would JIT at load")


def compiler_loaded() -> bool:
    try:
        return "libtvm_compiler" in Path("/proc/self/maps").read_text()
    except OSError:
        return False


def run_plan(plan_path: Path) -> dict[str, Any]:
    root = plan_path.parent
    plan = json.loads(plan_path.read_text())
    prepare_site(root)
    os.environ.setdefault("TVM_USE_RUNTIME_LIB", "1")
    started = time.perf_counter()
    cudart = preload_cudart() if plan["device"] == "cuda" else ""
    import tvm
    import tvm_ffi
    from tvm.runtime.vm import VirtualMachine

    if plan["device"] == "cuda":
        # Runtime-only TVM skips its backends; the CUDA plug-in registers the cubin loader.
        ctypes.CDLL(str(Path(tvm.__file__).parent / "lib" / "libtvm_runtime_cuda.so"))
        # A library holding CUDA source instead of device code would be compiled at load
        # through this callback (NVRTC): make that an error, so loading proves the cubins.
        tvm_ffi.register_global_func("tvm_callback_cuda_compile", _refuse_jit, override=True)
        device = tvm.cuda(0)
        if not device.exist:
            raise RuntimeError("no CUDA device is visible")
    else:
        device = tvm.cpu(0)
    report: dict[str, Any] = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "tvm_version": str(tvm.__version__),
        "tvm_path": str(Path(tvm.__file__).parent),
        "runtime_only": os.environ.get("TVM_USE_RUNTIME_LIB") == "1",
        "compiler_loaded": compiler_loaded(),
        "jit_at_load": "refused" if plan["device"] == "cuda" else "not applicable (CPU)",
        "cudart": cudart,
        "device": plan["device"],
        "import_s": round(time.perf_counter() - started, 3),
        "models": {},
    }
    if plan["device"] == "cuda":
        report["device_name"] = str(device.device_name)
        report["compute_version"] = str(device.compute_version)
    all_ok = True
    for entry in plan["models"]:
        t0 = time.perf_counter()
        vm = VirtualMachine(tvm.runtime.load_module(str(root / entry["library"])), device)
        model: dict[str, Any] = {"load_s": round(time.perf_counter() - t0, 3), "cases": []}
        model_diff, model_ok = 0.0, True
        for case in entry["cases"]:
            inputs = load_arrays(root / case["inputs"])
            args = [tvm.runtime.tensor(a, device=device) for a in inputs]
            t0 = time.perf_counter()
            outputs = flatten(vm[case["function"]](*args))
            row: dict[str, Any] = {
                "key": case["key"],
                "function": case["function"],
                "count": case["count"],
                "run_s": round(time.perf_counter() - t0, 4),
            }
            if "outputs" in case:
                out_path = root / case["outputs"]
                out_path.parent.mkdir(parents=True, exist_ok=True)
                np.savez(out_path, *outputs)
            if "expected" in case:
                expected = load_arrays(root / case["expected"])
                try:
                    if len(outputs) != len(expected):
                        raise ValueError(f"{len(outputs)} outputs, expected {len(expected)}")
                    errors = [worst_error(g, w) for g, w in zip(outputs, expected, strict=True)]
                    diff = max((e[0] for e in errors), default=0.0)
                    ok = max((e[1] for e in errors), default=0.0) <= 1.0
                except ValueError as err:
                    diff, ok = float("inf"), False
                    row["error"] = str(err)
                row.update(max_abs_diff=diff, ok=ok)
                model_diff, model_ok = max(model_diff, diff), model_ok and ok
            model["cases"].append(row)
        model.update(max_abs_diff=model_diff, ok=model_ok)
        report["models"][entry["name"]] = model
        all_ok = all_ok and model_ok
    report["ok"] = all_ok
    return report


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    default_plan = Path(__file__).resolve().with_name(PLAN)
    parser.add_argument("--plan", type=Path, default=default_plan, help="the cases to run")
    parser.add_argument("--json", type=Path, help="write the report here as JSON")
    args = parser.parse_args(argv)
    try:
        report = run_plan(args.plan.resolve())
    except Exception:  # noqa: BLE001 - exit 2 (could not check) must differ from 1 (mismatch)
        traceback.print_exc()
        return 2
    text = json.dumps(report, indent=2, sort_keys=True)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    for name, model in report["models"].items():
        worst = model["max_abs_diff"]
        print(f"{name}: max abs diff {worst:.3g} ({'ok' if model['ok'] else 'FAILED'})")
    print("all ok" if report["ok"] else "FAILED")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
