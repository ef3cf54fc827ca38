"""Prove a CUDA build: every kernel is in the cubin embedded in the artefact; on a GPU, run it."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dynshape_perception.compiler import tvm_adapter as tvmx
from dynshape_perception.compiler.cache import ArtefactCache
from dynshape_perception.compiler.targets import TargetProfile, load_profile
from dynshape_perception.models import MODEL_NAMES
from dynshape_perception.runtime.executable import LoadedModel
from dynshape_perception.tools.verify.common import (
    Comparison,
    ModelUnderTest,
    VerifyError,
    compare,
    load_models,
    make_cases,
)
from dynshape_perception.tools.verify.elf import EM_AARCH64, EM_CUDA, EM_X86_64, ElfFile

CUDA_TARGETS = ("cuda-orin", "cuda-hopper")


@dataclass
class GpuCount:
    count: int
    dims: dict[str, int]
    functions: dict[str, Comparison] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.functions.values())

    @property
    def max_abs_diff(self) -> float:
        return max((c.max_abs_diff for c in self.functions.values()), default=0.0)


@dataclass
class CudaModelResult:
    name: str
    weights: str
    library: str
    library_bytes: int
    host_elf: str
    device_code_format: str
    cubin_bytes: int
    cubin_arch: str
    e_machine: int
    kernels: list[str]
    missing_kernels: list[str]
    compile_s: float
    gpu: list[GpuCount] | None = None

    @property
    def ok(self) -> bool:
        gpu_ok = self.gpu is None or all(c.ok for c in self.gpu)
        return not self.missing_kernels and gpu_ok

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "kernels": len(self.kernels),
            "kernel_names": self.kernels,
            "missing_kernels": self.missing_kernels,
            "cubin_bytes": self.cubin_bytes,
            "cubin_arch": self.cubin_arch,
            "e_machine": self.e_machine,
            "device_code_format": self.device_code_format,
            "library": self.library,
            "library_bytes": self.library_bytes,
            "host_elf": self.host_elf,
            "compile_s": self.compile_s,
            "weights": self.weights,
            "ran_on_gpu": self.gpu is not None,
            "ok": self.ok,
        }
        if self.gpu is not None:
            out["max_abs_diff"] = max((c.max_abs_diff for c in self.gpu), default=0.0)
            out["counts"] = [c.count for c in self.gpu]
            out["per_count"] = [
                {
                    "count": c.count,
                    "dims": c.dims,
                    "max_abs_diff": c.max_abs_diff,
                    "ok": c.ok,
                    "functions": {n: f.max_abs_diff for n, f in c.functions.items()},
                }
                for c in self.gpu
            ]
        return out


@dataclass
class CudaReport:
    target: str
    arch: str
    nvcc: str
    gpu: bool
    models: dict[str, CudaModelResult]

    @property
    def ok(self) -> bool:
        return all(m.ok for m in self.models.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "models": {n: m.to_json() for n, m in self.models.items()},
            "target": self.target,
            "arch": self.arch,
            "nvcc": self.nvcc,
            "gpu": self.gpu,
        }


def nvcc_version() -> str:
    out = subprocess.run(
        [tvmx.nvcc_path(), "--version"], capture_output=True, text=True, check=False
    ).stdout
    found = re.search(r"release ([\d.]+)", out)
    return found.group(1) if found else "unknown"


def inspect_library(profile: TargetProfile, library: ElfFile) -> tuple[tvmx.CudaPayload, ElfFile]:
    """The one CUDA module embedded in an exported library, and its device code as ELF."""
    expected_host = EM_X86_64 if profile.host_arch == "x86_64" else EM_AARCH64
    if library.machine != expected_host:
        raise VerifyError(
            f"{library.origin} is {library.machine_name}; {profile.name} needs "
            f"{'x86-64' if profile.host_arch == 'x86_64' else 'AArch64'}"
        )
    blob = tvmx.parse_imports_blob(library.symbol_bytes(tvmx.imports_blob_symbol()))
    payloads = blob.cuda_payloads()
    if len(payloads) != 1:
        raise VerifyError(f"{library.origin} holds {len(payloads)} CUDA modules, expected 1")
    payload = payloads[0]
    if payload.fmt != tvmx.DEVICE_CODE_FORMAT:
        raise VerifyError(
            f"{library.origin} embeds CUDA as {payload.fmt!r}, not device code: it would be "
            "compiled when the library loads"
        )
    cubin = ElfFile(payload.code, f"the cubin in {library.origin}")
    if cubin.machine != EM_CUDA:
        raise VerifyError(f"{cubin.origin} is {cubin.machine_name}, not CUDA (e_machine 190)")
    return payload, cubin


def verify_cuda(
    target: str,
    cache: ArtefactCache,
    models: Sequence[str] = MODEL_NAMES,
    run_on_gpu: bool | None = None,
) -> CudaReport:
    """Build (nvcc runs in the build), inspect the embedded cubins, and run on a GPU if present."""
    if target not in CUDA_TARGETS:
        raise VerifyError(f"{target!r} is not a CUDA target; expected one of {CUDA_TARGETS}")
    profile = load_profile(target)
    arch = str(profile.cuda_arch)
    gpu = tvmx.cuda_available() and profile.host_is_native
    if run_on_gpu and not gpu:
        raise VerifyError(f"{target} cannot run here: no CUDA GPU, or its host is not x86-64")
    gpu = gpu if run_on_gpu is None else run_on_gpu
    results: dict[str, CudaModelResult] = {}
    for unit in load_models(models):
        artefact = cache.get_or_build(unit.model, unit.weights, profile)
        library = ElfFile.read(artefact.library_path)
        payload, cubin = inspect_library(profile, library)
        if cubin.cuda_arch() != arch:
            raise VerifyError(f"{cubin.origin} is for {cubin.cuda_arch()}, not {arch}")
        names = [k.name for k in payload.kernels]
        functions = cubin.function_names()
        result = CudaModelResult(
            name=unit.model.name,
            weights=unit.weights_source,
            library=str(artefact.library_path),
            library_bytes=artefact.library_path.stat().st_size,
            host_elf=library.machine_name,
            device_code_format=payload.fmt,
            cubin_bytes=len(payload.code),
            cubin_arch=cubin.cuda_arch(),
            e_machine=cubin.machine,
            kernels=names,
            missing_kernels=[n for n in names if n not in functions],
            compile_s=artefact.sidecar.compile_s,
        )
        if gpu:
            result.gpu = _run_on_gpu(unit, artefact.library_path)
        results[unit.model.name] = result
    return CudaReport(target, arch, nvcc_version(), gpu, results)


def _run_on_gpu(unit: ModelUnderTest, library: Path) -> list[GpuCount]:
    loaded = LoadedModel(unit.model, library, device=tvmx.cuda_device())
    by_count: dict[int, GpuCount] = {}
    for case in make_cases(unit):
        entry = by_count.setdefault(case.count, GpuCount(case.count, case.dims))
        entry.functions[case.function] = compare(loaded(case.function, *case.inputs), case.expected)
    return list(by_count.values())


def format_report(report: CudaReport) -> str:
    lines = [
        f"{report.target}: {report.arch}, nvcc {report.nvcc}, "
        f"{'run on the GPU' if report.gpu else 'no GPU here: device code checked only'}",
        f"{'model':<11} {'kernels':>7}  {'cubin bytes':>11}  {'library bytes':>13}  arch",
    ]
    for name, m in report.models.items():
        lines.append(
            f"{name:<11} {len(m.kernels):>7}  {m.cubin_bytes:>11}  {m.library_bytes:>13}  "
            f"{m.cubin_arch} (e_machine {m.e_machine}, {m.device_code_format} embedded)"
        )
        if m.missing_kernels:
            lines.append(f"  FAILED: kernels missing from the cubin: {m.missing_kernels}")
        for c in m.gpu or []:
            flag = "" if c.ok else "  FAILED"
            lines.append(f"  count {c.count:>7}: max abs diff {c.max_abs_diff:.3g}{flag}")
    lines.append("ok" if report.ok else "FAILED")
    return "\n".join(lines)
