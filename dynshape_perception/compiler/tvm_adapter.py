"""The only module that touches version-sensitive TVM APIs (build, targets, tensors, VM, export)."""

from __future__ import annotations

import math
import os
import shutil
import struct
import weakref
from collections.abc import Callable, Mapping
from dataclasses import dataclass
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


def cpu_features(target: Target) -> frozenset[str]:
    """The features LLVM enables for an llvm target: its triple and CPU, then ``mattr``."""
    if target.kind.name != "llvm":
        raise CompileError(f"CPU features need an llvm target, not {target.kind.name}")
    try:
        return frozenset(str(f) for f in tvm.target.codegen.llvm_get_cpu_features(target))
    except Exception as err:
        raise CompileError(f"LLVM cannot list the features of target {target}: {err}") from err


def target_kind(target: Target) -> str:
    return str(target.kind.name)


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


def fresh_loop_vars(func: PrimFunc) -> PrimFunc:
    """``func`` with a loop var defined at several places renamed at each later one (SSA).

    Block vars shared between blocks are left as they are: lowering replaces them by their
    bindings, and TVM 0.27 has no pass that renames them (``RenewDefs`` refuses a func that
    defines a var twice)."""
    return tirx.transform.ConvertSSA()(tvm.IRModule({"main": func}))["main"]


def expr_dtype(expr: Any) -> str:
    """The scalar type of an integer or float expression, such as ``int64``."""
    return str(expr.ty)


def same_expr(a: Any, b: Any) -> bool:
    return bool(tvm_ffi.structural_equal(a, b))


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
    """Build; for a CUDA target also compile the device code, which export_library embeds."""
    try:
        executable = tvm.compile(mod, target=target)
    except Exception as err:
        raise CompileError(f"TVM build for {target} failed: {err}") from err
    if target_kind(target) == "cuda":
        arch = str(target.attrs["arch"])
        _DEVICE_CODE[executable] = {
            src: compile_cuda(src, arch, target) for src in cuda_sources_list(executable)
        }
    return executable


def build_prim_func(func: PrimFunc, target: Target) -> Callable[..., None]:
    """A standalone TIR kernel (named by its ``global_symbol``), called on NumPy arrays. Outputs
    must be 64-byte aligned (``aligned_empty``), or the kernel writes to a copy."""
    attrs = func.attrs or {}
    if "global_symbol" not in attrs:
        raise CompileError("a standalone TIR kernel needs a global_symbol to be called by")
    name = str(attrs["global_symbol"])
    try:
        kernel = tvm.compile(tvm.IRModule({name: func}), target=target)[name]
    except Exception as err:
        raise CompileError(f"TVM build of {name} for {target} failed: {err}") from err

    def run(*arrays: np.ndarray) -> None:
        kernel(*(to_tensor_view(a) for a in arrays))

    return run


def export_library(executable: Executable, path: Path, cross_compiler: str | None = None) -> None:
    kwargs: dict[str, Any] = {}
    if cross_compiler:
        if shutil.which(cross_compiler) is None:
            raise CompileError(f"cross compiler {cross_compiler!r} is not installed")
        kwargs["cc"] = cross_compiler
    if cuda_modules(executable):
        kwargs["fpack_imports"] = _device_code_packer(device_code(executable))
    try:
        executable.export_library(str(path), **kwargs)
    except CompileError:
        raise
    except Exception as err:
        raise CompileError(f"exporting {path.name} failed: {err}") from err


def load_library(path: Path) -> Any:
    return tvm.runtime.load_module(str(path))


def cpu_threads() -> int:
    """Threads of the calling thread's TVM pool, which serves its parallel loops. Each calling
    thread has its own, sized from ``TVM_NUM_THREADS`` when it first runs one; without it,
    TVM takes half the logical CPUs on x86 (it assumes two hardware threads per core)."""
    return int(tvm.get_global_func("runtime.NumThreads")())


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
    fn: Callable[..., Any] = vm[name]
    return fn


def structural_hash(mod: IRModule) -> str:
    return f"{tvm_ffi.structural_hash(mod) & 0xFFFFFFFFFFFFFFFF:016x}"


def save_json(node: Any) -> str:
    return str(tvm.ir.save_json(node))


def load_json(text: str) -> Any:
    return tvm.ir.load_json(text)


def compile_cuda(source: str, arch: str, target: Target, fmt: str = "cubin") -> bytes:
    """CUDA C source -> device code with nvcc (TVM's flags: -O3, fast math); nvcc's log on error."""
    from tvm.support import nvcc

    nvcc_path()
    try:
        with target:
            return bytes(nvcc.compile_cuda(source, target_format=fmt, arch=arch, compiler="nvcc"))
    except Exception as err:
        raise CompileError(f"nvcc failed for {arch}: {err}") from err


# --- Device code and runtime-only loading (verify, bundle) ---
#
# TVM 0.27 built without a GPU keeps CUDA modules as source (fmt "cuda"); the runtime then needs
# ``tvm_callback_cuda_compile`` (NVRTC or nvcc in Python) to JIT them when the library loads.
# ``build`` compiles the source with nvcc instead, and ``export_library`` swaps each CUDA
# module's serialized payload [fmt][fmap][code] for [DEVICE_CODE_FORMAT][fmap][cubin] while
# packing the imports, so loading runs cuModuleLoadData on the cubin and compiles nothing.

CUDA_BIN_DIR = Path("/usr/local/cuda/bin")
DEVICE_CODE_FORMAT = "cubin"
CUDA_MODULE_KIND = "cuda"
# The imports tree marks the host library itself with this kind; it has no payload.
_HOST_LIBRARY_KIND = "_lib"
# Executables built for a CUDA target -> {CUDA source: device code}; filled by ``build``.
_DEVICE_CODE: weakref.WeakKeyDictionary[Any, dict[str, bytes]] = weakref.WeakKeyDictionary()
# What a runtime-only install of the TVM package leaves out (TVM_USE_RUNTIME_LIB=1 never loads
# the compiler; the rest are C++ headers and sources for compiling, not for loading).
RUNTIME_ONLY_EXCLUDES = ("lib/libtvm_compiler.so", "3rdparty", "include", "src", "lib64")
RUNTIME_ONLY_ENV = {"TVM_USE_RUNTIME_LIB": "1"}
TVM_FFI_VERSION: str = str(tvm_ffi.__version__)
# The CUDA runtime plug-in the runtime-only loader has to load by hand (it skips backends).
CUDA_RUNTIME_LIBRARY = "lib/libtvm_runtime_cuda.so"


def nvcc_path() -> str:
    """The nvcc executable (CUDA's bin folder is put on PATH for TVM's nvcc helper)."""
    if CUDA_BIN_DIR.is_dir() and str(CUDA_BIN_DIR) not in os.environ.get("PATH", "").split(
        os.pathsep
    ):
        os.environ["PATH"] = str(CUDA_BIN_DIR) + os.pathsep + os.environ.get("PATH", "")
    found = shutil.which("nvcc")
    if found is None:
        raise CompileError(f"nvcc is not installed (looked on PATH and in {CUDA_BIN_DIR})")
    return found


def cuda_modules(executable: Executable) -> list[Any]:
    """Every CUDA module imported by a built executable (depth first)."""
    found: list[Any] = []

    def walk(module: Any) -> None:
        if str(module.kind) == CUDA_MODULE_KIND:
            found.append(module)
        for sub in module.imports:
            walk(sub)

    walk(executable.mod)
    return found


def cuda_sources_list(executable: Executable) -> list[str]:
    return [str(module.inspect_source()) for module in cuda_modules(executable)]


def device_code(executable: Executable) -> dict[str, bytes]:
    """{CUDA source: device code} compiled by ``build`` for this executable."""
    code = _DEVICE_CODE.get(executable)
    if code is None:
        raise CompileError("this CUDA executable was not built by tvm_adapter.build")
    return dict(code)


@dataclass(frozen=True)
class KernelInfo:
    name: str
    arg_types: tuple[str, ...]
    launch_params: tuple[str, ...]


@dataclass(frozen=True)
class CudaPayload:
    """A CUDA module as serialized in a library: format, kernel table and code."""

    fmt: str
    kernels: tuple[KernelInfo, ...]
    kernel_table: bytes
    code: bytes

    def to_bytes(self) -> bytes:
        return _pack_str(self.fmt.encode()) + self.kernel_table + _pack_str(self.code)


@dataclass(frozen=True)
class ImportedModule:
    kind: str
    payload: bytes


@dataclass(frozen=True)
class ImportsBlob:
    """The ``__tvm_ffi__library_bin`` blob: the imports tree and each module's payload."""

    row_ptr: tuple[int, ...]
    child_indices: tuple[int, ...]
    modules: tuple[ImportedModule, ...]

    def to_bytes(self) -> bytes:
        body = _pack_u64s(self.row_ptr) + _pack_u64s(self.child_indices)
        for module in self.modules:
            body += _pack_str(module.kind.encode())
            if module.kind != _HOST_LIBRARY_KIND:
                body += _pack_str(module.payload)
        return struct.pack("<Q", len(body)) + body

    def cuda_payloads(self) -> list[CudaPayload]:
        return [parse_cuda_payload(m.payload) for m in self.modules if m.kind == CUDA_MODULE_KIND]


class _Reader:
    def __init__(self, data: bytes, what: str) -> None:
        self.data, self.offset, self.what = data, 0, what

    def u64(self) -> int:
        if self.offset + 8 > len(self.data):
            raise CompileError(f"{self.what} is truncated at byte {self.offset}")
        (value,) = struct.unpack_from("<Q", self.data, self.offset)
        self.offset += 8
        return int(value)

    def raw(self, size: int) -> bytes:
        if size < 0 or self.offset + size > len(self.data):
            raise CompileError(f"{self.what} is truncated at byte {self.offset}")
        out = self.data[self.offset : self.offset + size]
        self.offset += size
        return out

    def bytes_(self) -> bytes:
        return self.raw(self.u64())

    def text(self) -> str:
        return self.bytes_().decode()

    def done(self) -> bool:
        return self.offset == len(self.data)


def _pack_str(data: bytes) -> bytes:
    return struct.pack("<Q", len(data)) + data


def _pack_u64s(values: tuple[int, ...]) -> bytes:
    return struct.pack(f"<Q{len(values)}Q", len(values), *values)


def parse_imports_blob(blob: bytes) -> ImportsBlob:
    reader = _Reader(blob, "the library's imports blob")
    size = reader.u64()
    if size != len(blob) - 8:
        raise CompileError(f"imports blob says {size} bytes but holds {len(blob) - 8}")
    row_ptr = tuple(reader.u64() for _ in range(reader.u64()))
    child_indices = tuple(reader.u64() for _ in range(reader.u64()))
    modules: list[ImportedModule] = []
    for _ in range(max(len(row_ptr) - 1, 0)):
        kind = reader.text()
        payload = b"" if kind == _HOST_LIBRARY_KIND else reader.bytes_()
        modules.append(ImportedModule(kind, payload))
    if not reader.done():
        raise CompileError("imports blob has trailing bytes: its format changed in this TVM")
    return ImportsBlob(row_ptr, child_indices, tuple(modules))


def parse_cuda_payload(payload: bytes) -> CudaPayload:
    """[fmt][Map<name, FunctionInfo{name, arg_types, launch_param_tags, arg_extra_tags}>][code]."""
    reader = _Reader(payload, "a CUDA module payload")
    fmt = reader.text()
    start = reader.offset
    kernels: list[KernelInfo] = []
    for _ in range(reader.u64()):
        reader.text()
        name = reader.text()
        arg_types = tuple(_dtype_text(reader.raw(4)) for _ in range(reader.u64()))
        launch = tuple(reader.text() for _ in range(reader.u64()))
        reader.raw(4 * reader.u64())
        kernels.append(KernelInfo(name, arg_types, launch))
    table = payload[start : reader.offset]
    code = reader.bytes_()
    if not reader.done():
        raise CompileError("CUDA module payload has trailing bytes: its format changed in this TVM")
    return CudaPayload(fmt, tuple(kernels), table, code)


def _dtype_text(raw: bytes) -> str:
    code, bits, lanes = struct.unpack("<BBH", raw)
    name = {0: "int", 1: "uint", 2: "float", 3: "handle", 4: "bfloat"}.get(code, f"code{code}")
    return f"{name}{bits}" + (f"x{lanes}" if lanes != 1 else "")


def _device_code_packer(code: Mapping[str, bytes]) -> Callable[[Any, bool, str, str], str]:
    """An ``fpack_imports`` for export_library that embeds ``code`` in place of CUDA source."""

    def pack(module: Any, is_system_lib: bool, prefix: str, workspace_dir: str) -> str:
        if is_system_lib:
            raise CompileError("embedding CUDA device code in a system library is not supported")
        packed = tvm_ffi.get_global_func("runtime.ModulePackImportsToTensor")(module)
        blob = parse_imports_blob(packed.numpy().tobytes())
        modules = []
        for imported in blob.modules:
            if imported.kind == CUDA_MODULE_KIND:
                cuda = parse_cuda_payload(imported.payload)
                if cuda.fmt == "cuda":
                    binary = code.get(cuda.code.decode())
                    if binary is None:
                        raise CompileError("no device code was compiled for a CUDA module")
                    cuda = CudaPayload(DEVICE_CODE_FORMAT, cuda.kernels, cuda.kernel_table, binary)
                imported = ImportedModule(imported.kind, cuda.to_bytes())
            modules.append(imported)
        data = ImportsBlob(blob.row_ptr, blob.child_indices, tuple(modules)).to_bytes()
        symbol = prefix + imports_blob_symbol()
        path = Path(workspace_dir) / f"{prefix}devc.c"
        path.write_text(_c_array(symbol, data))
        return str(path)

    return pack


def _c_array(symbol: str, data: bytes) -> str:
    rows = (",".join(f"0x{b:02x}" for b in data[i : i + 32]) for i in range(0, len(data), 32))
    body = ",\n".join(rows)
    return (
        '#ifdef __cplusplus\nextern "C" {\n#endif\n'
        f'__attribute__((visibility("default"))) extern const unsigned char {symbol}[];\n'
        f"const unsigned char {symbol}[{len(data)}] = {{\n{body}\n}};\n"
        "#ifdef __cplusplus\n}\n#endif\n"
    )


def imports_blob_symbol() -> str:
    return str(tvm_ffi.get_global_func("runtime.ModuleImportsBlobName")())


def tvm_package_dir() -> Path:
    return Path(tvm.__file__).resolve().parent


def runtime_only_excluded(relative: Path) -> bool:
    """Whether a file of the TVM package is left out of a runtime-only install."""
    text = relative.as_posix()
    if "__pycache__" in relative.parts or text.endswith(".pyc"):
        return True
    return any(text == ex or text.startswith(ex + "/") for ex in RUNTIME_ONLY_EXCLUDES)


# --- Schedule support (kernels) ---


def func_attr(func: PrimFunc, key: str) -> Any:
    """One attribute of a PrimFunc, or None."""
    return None if func.attrs is None else func.attrs.get(key, None)


def to_python(value: Any) -> Any:
    """TVM attribute values (maps, arrays, immediates, strings) as plain Python values."""
    if isinstance(value, tirx.IntImm):
        return int(value.value)
    if isinstance(value, tirx.FloatImm):
        return float(value.value)
    if isinstance(value, str):
        return str(value)
    if isinstance(value, Mapping) or hasattr(value, "items"):
        return {str(k): to_python(v) for k, v in value.items()}
    if isinstance(value, list | tuple) or hasattr(value, "__len__"):
        return [to_python(v) for v in value]
    return value


def same_signature(a: PrimFunc, b: PrimFunc) -> bool:
    """Same number and dtypes of parameters (buffers are bound inside the body in 0.27)."""
    return [str(p.dtype) for p in a.params] == [str(p.dtype) for p in b.params]


def executable_source(executable: Executable, fmt: str = "asm") -> str:
    """Host code of a built CPU executable: ``"asm"`` or ``"ll"`` (LLVM IR)."""
    module = executable.mod
    texts = [str(m.inspect_source(fmt)) for m in [module, *module.imports] if str(m.kind) == "llvm"]
    return "\n".join(texts)


TENSOR_ALIGNMENT = 64


def aligned_empty(shape: tuple[int, ...], dtype: Any) -> np.ndarray:
    """An uninitialised array at TVM's alignment: ``to_tensor_view`` wraps it without a copy."""
    kind = np.dtype(dtype)
    raw = np.empty(math.prod(shape) * kind.itemsize + TENSOR_ALIGNMENT, np.uint8)
    return np.ndarray(shape, kind, raw, -raw.ctypes.data % TENSOR_ALIGNMENT)


def to_tensor_view(array: np.ndarray) -> Any:
    """A CPU tensor over ``array``'s memory through DLPack, without ``to_tensor``'s copy.
    TVM requires 64-byte aligned data, so other arrays are copied into an aligned buffer
    first; the tensor keeps its buffer alive."""
    data = np.ascontiguousarray(array)
    if data.size == 0:
        return tvm.runtime.empty(data.shape, str(data.dtype))
    # DLPack refuses read-only buffers (np.frombuffer of a message, a memory-mapped scan).
    if data.ctypes.data % TENSOR_ALIGNMENT or not data.flags.writeable:
        aligned = aligned_empty(data.shape, data.dtype)
        aligned[...] = data
        data = aligned
    return tvm.runtime.from_dlpack(data)


def to_numpy_views(value: Any) -> list[np.ndarray]:
    """VM results as arrays sharing the tensors' memory (the VM allocates outputs per call)."""
    if isinstance(value, tvm.runtime.Tensor):
        return [np.from_dlpack(value)]
    out: list[np.ndarray] = []
    for item in value:
        out.extend(to_numpy_views(item))
    return out


def upper_bound(expr: Any, bounds: Mapping[str, int]) -> int | None:
    """The largest value of an integer expression when each symbolic var named in ``bounds``
    lies in [0, bound]: interval analysis on the dims; None where it stays unbounded."""
    from tvm import sym

    if isinstance(expr, int | tirx.IntImm):
        return int(expr)
    analyzer = sym.Analyzer()
    for var in tirx.analysis.undefined_vars(expr):
        if str(var.name) in bounds:
            analyzer.update(var, sym.ConstIntBound(0, int(bounds[str(var.name)])))
    value = int(analyzer.const_int_bound(expr).max_value)
    return None if value >= _INT64_MAX else value


_INT64_MAX = 2**63 - 1


def symbolic_var_bounds(mod: IRModule) -> dict[str, int]:
    """Upper bounds of the symbolic dims that ``set_upper_bounds`` attached to the module."""
    out: dict[str, int] = {}
    for func in mod.functions.values():
        if isinstance(func, relax.Function) and func.attrs is not None:
            for name, bound in (func.attrs.get("tir_var_upper_bound", None) or {}).items():
                out[str(name)] = int(bound)
    return out
