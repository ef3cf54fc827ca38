"""A runtime-only bundle runs in a clean interpreter without libtvm_compiler.so; matches NumPy."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dynshape_perception.compiler.cache import ArtefactCache
from dynshape_perception.models import MODEL_NAMES
from dynshape_perception.tools import bundle as bundle_module
from dynshape_perception.tools.bundle import RUNNER, BundleError, BundleReport, write_bundle
from dynshape_perception.tools.verify.common import load_arrays, save_arrays

# What a destination machine brings: NumPy and ml_dtypes, no TVM.
DESTINATION_PACKAGES = ("numpy", "numpy.libs", "ml_dtypes", "typing_extensions.py")


@pytest.fixture(scope="module")
def cpu_bundle(tmp_path_factory: pytest.TempPathFactory, cache_root: Path) -> BundleReport:
    out = tmp_path_factory.mktemp("bundle") / "x86_64"
    return write_bundle("x86_64", out, ArtefactCache(cache_root))


@pytest.fixture(scope="module")
def numpy_only(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A site folder with NumPy and ml_dtypes only, linked from this environment."""
    site = tmp_path_factory.mktemp("numpy_only")
    installed = Path(np.__file__).resolve().parents[1]
    for name in DESTINATION_PACKAGES:
        if (installed / name).exists():
            (site / name).symlink_to(installed / name)
    return site


def run_bundle(bundle: Path, numpy_only: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # -S: no site-packages, so the only TVM in reach is the bundle's.
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(numpy_only)}
    return subprocess.run(
        [sys.executable, "-S", str(bundle / RUNNER), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def test_cpu_bundle_runs_runtime_only_and_matches_numpy(
    cpu_bundle: BundleReport, numpy_only: Path, tmp_path: Path
) -> None:
    bundle = cpu_bundle.out_dir
    assert not (bundle / "site" / "tvm" / "lib" / "libtvm_compiler.so").exists()
    assert (bundle / "site" / "tvm" / "lib" / "libtvm_runtime.so").is_file()
    assert len(list((bundle / "wheels").glob("apache_tvm_ffi-*.whl"))) == 1
    assert cpu_bundle.total_bytes < 40e6
    proc = run_bundle(bundle, numpy_only, "--json", str(tmp_path / "report.json"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["runtime_only"] and not report["compiler_loaded"]
    assert Path(report["tvm_path"]).resolve() == (bundle / "site" / "tvm").resolve()
    assert set(report["models"]) == set(MODEL_NAMES)
    for name, model in report["models"].items():
        assert model["ok"] and model["max_abs_diff"] < 1e-3, name
        assert {c["count"] for c in model["cases"]} >= {0, 1}


def test_bundle_runner_fails_on_a_wrong_reference(
    cpu_bundle: BundleReport, numpy_only: Path
) -> None:
    bundle = cpu_bundle.out_dir
    plan = json.loads((bundle / "plan.json").read_text())
    case = plan["models"][1]["cases"][-1]
    wrong = [a + np.float32(1e-2) for a in load_arrays(bundle / case["expected"])]
    save_arrays(bundle / "cases" / "wrong.npz", wrong)
    case["expected"] = "cases/wrong.npz"
    (bundle / "wrong_plan.json").write_text(json.dumps(plan))
    proc = run_bundle(bundle, numpy_only, "--plan", str(bundle / "wrong_plan.json"))
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert f"{plan['models'][1]['name']}: max abs diff" in proc.stdout
    assert "FAILED" in proc.stdout


def test_cuda_hopper_bundle_fits_and_names_its_cuda_runtime(
    tmp_path: Path, cache_root: Path
) -> None:
    report = write_bundle("cuda-hopper", tmp_path / "cuda-hopper", ArtefactCache(cache_root))
    assert report.total_bytes < 60e6
    assert report.destination.python == "3.12"
    assert "libcudart.so.13" in report.requires and "libcuda.so.1" in report.requires
    (wheel,) = (report.out_dir / "wheels").glob("apache_tvm_ffi-*.whl")
    assert "cp312" in wheel.name and "x86_64" in wheel.name
    assert (report.out_dir / "site" / "tvm" / "lib" / "libtvm_runtime_cuda.so").is_file()
    assert json.loads((report.out_dir / "plan.json").read_text())["device"] == "cuda"


@pytest.mark.parametrize(
    ("python", "max_mb", "message"),
    [
        ("abc", 60.0, "X.Y"),
        ("3", 60.0, "X.Y"),
        (None, float("nan"), "finite number of MB > 0"),
        (None, -1.0, "finite number of MB > 0"),
        (None, 0.0, "finite number of MB > 0"),
    ],
)
def test_bad_python_or_limit_writes_nothing(
    tmp_path: Path, python: str | None, max_mb: float, message: str
) -> None:
    with pytest.raises(BundleError, match=message):
        write_bundle("x86_64", tmp_path / "b", python=python, max_mb=max_mb)
    assert not list(tmp_path.iterdir())


def test_an_over_limit_or_failed_bundle_is_never_published(
    tmp_path: Path, cache_root: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    out = tmp_path / "x86_64"
    with pytest.raises(BundleError, match="over its 1 MB limit"):
        write_bundle("x86_64", out, ArtefactCache(cache_root), ["segmenter"], max_mb=1.0)
    assert not list(tmp_path.iterdir()), "nothing published, nothing left to block a retry"
    report = write_bundle("x86_64", out, ArtefactCache(cache_root), ["segmenter"])
    assert report.out_dir == out and (out / "bundle.json").is_file()
    before = sorted(p.relative_to(out) for p in out.rglob("*"))

    def offline_fault_injector(*_: object) -> Path:
        raise BundleError("cannot download apache-tvm-ffi: offline")

    monkeypatch.setattr(bundle_module, "fetch_wheel", offline_fault_injector)
    with pytest.raises(BundleError, match="offline"):
        write_bundle("x86_64", out, ArtefactCache(cache_root), ["segmenter"])
    assert [p.name for p in tmp_path.iterdir()] == ["x86_64"], "no temp folder left"
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before, "old bundle intact"
