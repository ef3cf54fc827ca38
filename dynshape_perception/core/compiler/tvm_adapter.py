"""The only module that touches version-sensitive TVM APIs (build, targets, tensors, VM, export)."""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeAlias

import numpy as np
import tvm
import tvm_ffi
from tvm import relax, tirx
from tvm.relax.frontend import nn

from dynshape_perception.errors import CompileError

# TVM ships no type stubs; these aliases document intent at the adapter's boundary.
Target: TypeAlias = Any
IRModule: TypeAlias = Any
PrimFunc: TypeAlias = Any
Executable: TypeAlias = Any
VirtualMachine: TypeAlias = Any

TVM_VERSION: str = str(tvm.__version__)
SCHEDULED_ATTR = "tirx.is_scheduled"


def make_target(spec: Mapping[str, Any]) -> Target:
    """A target from a dict; ``host`` may itself be a dict. CLI strings are not accepted by 0.27."""
    spec = dict(spec)
    host = spec.pop("host", None)
    try:
        if host is not None:
            return tvm.target.Target(spec, host=tvm.target.Target(dict(host)))
        return tvm.target.Target(spec)
    except Exception as err:
        raise CompileError(f"invalid target {spec}: {err}") from err


def system_cpu() -> str:
    return str(tvm.target.codegen.llvm_get_system_cpu())


def target_kind(target: Target) -> str:
    return str(target.kind.name)


def target_host_triple(target: Target) -> str:
    host = target.host if target.host is not None else target
    return str(host.attrs.get("mtriple", "")) if host.kind.name == "llvm" else ""


def export_module(
    module: nn.Module, spec: Mapping[str, Any]
) -> tuple[IRModule, list[tuple[str, Any]]]:
    mod, params = module.export_tvm(spec=dict(spec))
    return mod, list(params)


def bind_weights(mod: IRModule, weights: Mapping[str, np.ndarray]) -> IRModule:
    """Bind parameters, by their Relax variable names, as constants in every entry function."""
    out = mod
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function) and func.attrs and "num_input" in func.attrs:
            names = {str(p.name) for p in func.params}
            values = {k: tvm.runtime.tensor(v) for k, v in weights.items() if k in names}
            out = relax.transform.BindParams(gv.name_hint, values)(out)
    return out


def set_upper_bounds(mod: IRModule, bounds: Mapping[str, int]) -> IRModule:
    """Attach symbolic-dim upper bounds so memory planning sizes buffers once, for the maximum."""
    out = mod
    for gv, func in mod.functions.items():
        if isinstance(func, relax.Function):
            out[gv] = func.with_attr("tir_var_upper_bound", {k: int(v) for k, v in bounds.items()})
    return out


def lower_to_tir(mod: IRModule, target: Target) -> IRModule:
    """Legalise Relax ops to TIR and fuse elementwise epilogues into their producers."""
    seq = tvm.transform.Sequential(
        [
            relax.transform.LegalizeOps(),
            relax.transform.AnnotateTIROpPattern(),
            relax.transform.FoldConstant(),
            relax.transform.FuseOps(),
            relax.transform.FuseTIR(),
            relax.transform.DeadCodeElimination(),
        ]
    )
    with target:
        return seq(mod)


def planned_storage_bytes(mod: IRModule) -> dict[str, int]:
    """Bytes of storage Relax memory planning allocates per entry function, at the bounds.

    With upper bounds attached, StaticPlanBlockMemory turns symbolic allocations into fixed
    ones planned once for the maximum; a size that stays symbolic is reported as -1.
    """
    seq = tvm.transform.Sequential(
        [
            relax.transform.ToNonDataflow(),
            relax.transform.RemovePurityChecking(),
            relax.transform.CallTIRRewrite(),
            relax.transform.StaticPlanBlockMemory(),
        ]
    )
    planned = seq(mod)
    out: dict[str, int] = {}
    for gv, func in planned.functions.items():
        if not isinstance(func, relax.Function):
            continue
        sizes: list[int] = []

        def visit(expr: Any, sizes: list[int] = sizes) -> None:
            op = getattr(expr, "op", None)
            if isinstance(expr, relax.Call) and getattr(op, "name", "") == (
                "relax.memory.alloc_storage"
            ):
                dims = expr.args[0].values
                sizes.append(int(dims[0]) if isinstance(dims[0], tirx.IntImm) else -1)

        relax.analysis.post_order_visit(func.body, visit)
        out[gv.name_hint] = -1 if -1 in sizes else sum(sizes)
    return out


def prim_funcs(mod: IRModule) -> dict[str, PrimFunc]:
    return {gv.name_hint: f for gv, f in mod.functions.items() if isinstance(f, tirx.PrimFunc)}


def replace_prim_func(mod: IRModule, name: str, func: PrimFunc) -> None:
    mod[mod.get_global_var(name)] = func.with_attr(SCHEDULED_ATTR, True)


def is_scheduled(func: PrimFunc) -> bool:
    return bool(func.attrs is not None and func.attrs.get(SCHEDULED_ATTR, False))


def apply_gpu_default_schedules(mod: IRModule, target: Target) -> IRModule:
    from tvm.s_tir import dlight as dl

    with target:
        return dl.ApplyDefaultSchedule(
            dl.gpu.Matmul(),
            dl.gpu.GEMV(),
            dl.gpu.Reduction(),
            dl.gpu.GeneralReduction(),
            dl.gpu.Fallback(),
        )(mod)


def build(mod: IRModule, target: Target) -> Executable:
    try:
        return tvm.compile(mod, target=target)
    except Exception as err:
        raise CompileError(f"TVM build for {target} failed: {err}") from err


def export_library(executable: Executable, path: Path, cross_compiler: str | None = None) -> None:
    kwargs: dict[str, Any] = {}
    if cross_compiler:
        if shutil.which(cross_compiler) is None:
            raise CompileError(f"cross compiler {cross_compiler!r} is not installed")
        kwargs["cc"] = cross_compiler
    try:
        executable.export_library(str(path), **kwargs)
    except Exception as err:
        raise CompileError(f"exporting {path.name} failed: {err}") from err


def load_library(path: Path) -> Any:
    return tvm.runtime.load_module(str(path))


def cpu_device() -> Any:
    return tvm.cpu()


def cuda_device() -> Any:
    return tvm.cuda()


def cuda_available() -> bool:
    try:
        return bool(tvm.runtime.enabled("cuda")) and bool(tvm.cuda().exist)
    except Exception:  # noqa: BLE001 - no driver means no CUDA
        return False


def make_vm(library: Any, device: Any) -> VirtualMachine:
    return relax.VirtualMachine(library, device)


def to_tensor(array: np.ndarray, device: Any = None) -> Any:
    if device is None:
        return tvm.runtime.tensor(array)
    return tvm.runtime.tensor(array, device=device)


def to_numpy(value: Any) -> list[np.ndarray]:
    """VM results (one tensor or a nested tuple) as a flat list of arrays."""
    if isinstance(value, tvm.runtime.Tensor):
        return [value.numpy()]
    out: list[np.ndarray] = []
    for item in value:
        out.extend(to_numpy(item))
    return out


def vm_function(vm: VirtualMachine, name: str) -> Callable[..., Any]:
    return vm[name]


def structural_hash(mod: IRModule) -> str:
    return f"{tvm_ffi.structural_hash(mod) & 0xFFFFFFFFFFFFFFFF:016x}"


def save_json(node: Any) -> str:
    return str(tvm.ir.save_json(node))


def load_json(text: str) -> Any:
    return tvm.ir.load_json(text)


def cuda_sources(executable: Executable) -> str:
    """The CUDA C source of a built CUDA module (TVM keeps source only when no GPU is present)."""
    sources: list[str] = []

    def walk(module: Any) -> None:
        kind = str(module.type_key) if hasattr(module, "type_key") else ""
        if kind == "cuda":
            sources.append(str(module.inspect_source()))
        for sub in module.imports:
            walk(sub)

    walk(executable.mod)
    return "\n".join(sources)


def compile_cuda(source: str, arch: str, target: Target, fmt: str = "cubin") -> bytes:
    from tvm.support import nvcc

    cuda_bin = "/usr/local/cuda/bin"
    if Path(cuda_bin).is_dir() and cuda_bin not in os.environ.get("PATH", ""):
        os.environ["PATH"] = cuda_bin + os.pathsep + os.environ.get("PATH", "")
    try:
        with target:
            return bytes(nvcc.compile_cuda(source, target_format=fmt, arch=arch, compiler="nvcc"))
    except Exception as err:
        raise CompileError(f"nvcc failed for {arch}: {err}") from err
