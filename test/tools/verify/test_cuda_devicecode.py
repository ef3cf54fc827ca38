"""Every CUDA kernel of every model is compiled by nvcc and embedded in the artefact as a cubin."""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import pytest

from dynshape_perception.compiler import tvm_adapter as tvmx
from dynshape_perception.compiler.cache import ArtefactCache
from dynshape_perception.compiler.targets import load_profile
from dynshape_perception.errors import CompileError
from dynshape_perception.models import MODEL_NAMES
from dynshape_perception.tools.verify.common import load_model
from dynshape_perception.tools.verify.cuda import CUDA_TARGETS, verify_cuda
from dynshape_perception.tools.verify.elf import ElfFile

EM_CUDA = 190


@pytest.fixture(scope="module", autouse=True)
def nvcc() -> None:
    if shutil.which("nvcc") is None and not tvmx.CUDA_BIN_DIR.joinpath("nvcc").is_file():
        if os.environ.get("CI") == "true":
            pytest.fail(f"nvcc is missing (looked on PATH and in {tvmx.CUDA_BIN_DIR})")
        pytest.skip("nvcc is not installed")


@pytest.mark.parametrize("target", CUDA_TARGETS)
def test_every_kernel_is_in_the_embedded_cubin(target: str, cache_root: Path) -> None:
    profile = load_profile(target)
    report = verify_cuda(target, ArtefactCache(cache_root), run_on_gpu=False)
    assert set(report.models) == set(MODEL_NAMES)
    for name, result in report.models.items():
        assert result.kernels, name
        assert result.missing_kernels == [], name
        assert result.device_code_format == "cubin"
        assert result.cubin_arch == profile.cuda_arch
        # Independently of ElfFile: the embedded code is an ELF for NVIDIA CUDA.
        blob = ElfFile.read(Path(result.library)).symbol_bytes(tvmx.imports_blob_symbol())
        (payload,) = tvmx.parse_imports_blob(blob).cuda_payloads()
        assert payload.code[:4] == b"\x7fELF"
        assert struct.unpack_from("<H", payload.code, 18)[0] == EM_CUDA
        assert len(payload.code) == result.cubin_bytes > 1000
    assert report.ok


def test_imports_blob_round_trips_byte_for_byte(cache_root: Path) -> None:
    unit = load_model("associator")
    artefact = ArtefactCache(cache_root).get_or_build(
        unit.model, unit.weights, load_profile("cuda-hopper")
    )
    blob = ElfFile.read(artefact.library_path).symbol_bytes(tvmx.imports_blob_symbol())
    parsed = tvmx.parse_imports_blob(blob)
    assert parsed.to_bytes() == blob
    cuda = [m for m in parsed.modules if m.kind == tvmx.CUDA_MODULE_KIND]
    assert len(cuda) == 1
    assert tvmx.parse_cuda_payload(cuda[0].payload).to_bytes() == cuda[0].payload


def test_a_kernel_nvcc_rejects_fails_with_nvccs_message() -> None:
    source = 'extern "C" __global__ void broken(float* x) { x[0] = not_declared_anywhere; }'
    with pytest.raises(CompileError, match="not_declared_anywhere"):
        tvmx.compile_cuda(source, "sm_90", load_profile("cuda-hopper").target())
