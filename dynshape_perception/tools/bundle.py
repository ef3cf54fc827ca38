"""Runtime-only bundles: exported libraries, TVM minus its compiler, the tvm-ffi wheel, a runner."""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from packaging.tags import Tag, compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

from dynshape_perception.compiler import standalone_runner as runner
from dynshape_perception.compiler import tvm_adapter as tvmx
from dynshape_perception.compiler.cache import ArtefactCache, export_to, file_sha256
from dynshape_perception.compiler.targets import TargetProfile, load_profile
from dynshape_perception.errors import DynshapeError
from dynshape_perception.fsutil import StagedDir
from dynshape_perception.models import MODEL_NAMES
from dynshape_perception.tools.verify.common import load_models, make_cases, repo_root, write_cases
from dynshape_perception.tools.verify.elf import ElfFile

log = logging.getLogger(__name__)

RUNNER = "run_bundle.py"
MANIFEST = "bundle.json"
CASE_LAYOUT = {"inputs": "cases/{key}.npz", "expected": "cases/{key}.expected.npz"}
DEFAULT_MAX_MB = 60.0
# The Python of each destination: the GPU test machine runs 3.12; the vehicle image, like the
# emulated one, Debian's 3.11. Other x86 profiles default to this interpreter.
DESTINATION_PYTHON = {"cuda-hopper": "3.12", "cuda-orin": "3.11", "aarch64": "3.11"}
MANYLINUX = ("manylinux_2_28", "manylinux_2_27", "manylinux_2_24", "manylinux_2_17")
LEGACY_MANYLINUX = {"x86_64": ("manylinux2014_x86_64",), "aarch64": ("manylinux2014_aarch64",)}
# Libraries a destination must provide itself, with what they mean for the install.
SYSTEM_LIBRARIES = {
    "libcudart.so.13": "CUDA 13.x runtime (toolkit, or pip nvidia-cuda-runtime for CUDA 13)",
    "libcuda.so.1": "NVIDIA driver supporting CUDA 13 (R580 or newer)",
}


class BundleError(DynshapeError):
    """A bundle cannot be written (download failed, size over its limit, unknown destination)."""


@dataclass(frozen=True)
class Destination:
    machine: str
    python: str

    @property
    def platforms(self) -> list[str]:
        tags = [f"{tag}_{self.machine}" for tag in MANYLINUX]
        return tags + list(LEGACY_MANYLINUX[self.machine])

    def tags(self) -> set[Tag]:
        version = tuple(int(p) for p in self.python.split("."))
        interpreter = f"cp{version[0]}{version[1]}"
        return set(cpython_tags(version, platforms=self.platforms)) | set(
            compatible_tags(version, interpreter, self.platforms)
        )


def destination_for(profile: TargetProfile, python: str | None = None) -> Destination:
    machine = profile.host_arch
    default = DESTINATION_PYTHON.get(profile.name, f"{sys.version_info[0]}.{sys.version_info[1]}")
    return Destination(machine, python or default)


def wheel_cache_dir() -> Path:
    env = os.environ.get("DYNSHAPE_WHEEL_CACHE")
    return Path(env) if env else repo_root() / ".emu" / "cache" / "wheels"


def find_wheel(cache: Path, name: str, version: str, dest: Destination) -> Path | None:
    wanted = dest.tags()
    for path in sorted(cache.glob("*.whl")):
        try:
            w_name, w_version, _, w_tags = parse_wheel_filename(path.name)
        except ValueError:
            continue
        if (
            w_name == canonicalize_name(name)
            and str(w_version) == version
            and any(tag in wanted for tag in w_tags)
        ):
            return path
    return None


def fetch_wheel(name: str, version: str, dest: Destination, cache: Path) -> Path:
    """The wheel for the destination, from the cache or downloaded into it by pip."""
    found = find_wheel(cache, name, version, dest)
    if found is not None:
        return found
    cache.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps"]
    cmd += ["--only-binary=:all:", "--python-version", dest.python, "--implementation", "cp"]
    for plat in dest.platforms:
        cmd += ["--platform", plat]
    cmd += ["--dest", str(cache), f"{name}=={version}"]
    log.info("downloading %s==%s for %s Python %s", name, version, dest.machine, dest.python)
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    found = find_wheel(cache, name, version, dest)
    if proc.returncode != 0 or found is None:
        raise BundleError(
            f"cannot download {name}=={version} for {dest.machine} CPython {dest.python}:\n"
            f"{proc.stderr[-2000:]}"
        )
    return found


def _runtime_files(root: Path) -> Iterator[tuple[Path, Path]]:
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if path.is_file() and not tvmx.runtime_only_excluded(rel):
            yield path, rel


def copy_runtime_package(dest: Destination, site: Path, cache: Path) -> None:
    """The TVM package for the destination into ``site/tvm``, without its compiler library.

    The installed package serves an x86-64 destination (the wheel is the same for every
    Python); another machine gets the files of its own apache-tvm wheel.
    """
    target = site / "tvm"
    if dest.machine == platform.machine():
        for path, rel in _runtime_files(tvmx.tvm_package_dir()):
            (target / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(path, target / rel)
        return
    wheel = fetch_wheel("apache-tvm", tvmx.TVM_VERSION, dest, cache)
    with zipfile.ZipFile(wheel) as zf:
        for info in zf.infolist():
            rel = Path(info.filename)
            if rel.parts[0] != "tvm" or info.is_dir():
                continue
            if not tvmx.runtime_only_excluded(Path(*rel.parts[1:])):
                zf.extract(info, site)


@dataclass
class BundleReport:
    target: str
    out_dir: Path
    destination: Destination
    sizes: dict[str, int] = field(default_factory=dict)
    requires: dict[str, str] = field(default_factory=dict)
    models: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def total_bytes(self) -> int:
        return sum(self.sizes.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "target": self.target,
            "destination": asdict(self.destination),
            "tvm_version": tvmx.TVM_VERSION,
            "tvm_ffi_version": tvmx.TVM_FFI_VERSION,
            "runtime_env": tvmx.RUNTIME_ONLY_ENV,
            "requires": self.requires,
            "models": self.models,
            "sizes": self.sizes,
            "total_bytes": self.total_bytes,
        }


def _tree_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


def _readme(report: BundleReport) -> str:
    dest = report.destination
    lines = [
        f"Runtime-only bundle of the dynshape_perception models for {report.target}.",
        "",
        f"Destination: Linux {dest.machine}, CPython {dest.python}, glibc 2.28 or newer, with",
        "NumPy and ml_dtypes installed (the runner unpacks the bundled apache-tvm-ffi wheel).",
    ]
    lines += [f"Also needed: {lib}: {why}." for lib, why in report.requires.items()]
    lines += [
        "",
        f"Check it there: python3 {RUNNER} [--json report.json]",
        "It imports the bundled TVM with TVM_USE_RUNTIME_LIB=1 (no compiler library), loads",
        "artefacts/*.so, runs cases/ and compares with the saved NumPy reference outputs.",
        "Exit status 0: every output within 1e-4 x max(1, |reference|).",
    ]
    return "\n".join(lines) + "\n"


def check_python(python: str | None) -> str | None:
    """A destination CPython as ``X.Y``; checked before any artefact is written."""
    if python is None:
        return None
    if not re.fullmatch(r"[0-9]+\.[0-9]+", python):
        raise BundleError(f"--python must be a CPython version X.Y such as 3.11, got {python!r}")
    return python


def check_max_mb(max_mb: float) -> float:
    if isinstance(max_mb, bool) or not isinstance(max_mb, (int, float)):
        raise BundleError(f"the size limit must be a number of MB, got {max_mb!r}")
    if not (math.isfinite(max_mb) and max_mb > 0):
        raise BundleError(f"the size limit must be a finite number of MB > 0, got {max_mb!r}")
    return float(max_mb)


def _check_out_dir(out_dir: Path) -> None:
    if out_dir.is_symlink() or (out_dir.exists() and not out_dir.is_dir()):
        raise BundleError(f"{out_dir} exists and is not a folder: not replacing it")
    if out_dir.is_dir() and any(out_dir.iterdir()) and not (out_dir / MANIFEST).is_file():
        raise BundleError(f"{out_dir} is not empty and holds no {MANIFEST}: not replacing it")


def write_bundle(
    target: str,
    out_dir: Path,
    cache: ArtefactCache | None = None,
    models: Sequence[str] = MODEL_NAMES,
    python: str | None = None,
    max_mb: float = DEFAULT_MAX_MB,
    wheel_cache: Path | None = None,
) -> BundleReport:
    """Write ``out_dir``: artefacts/, cases/, site/tvm, wheels/, plan.json, run_bundle.py.

    The bundle is assembled in a sibling temp folder and renamed into place only once it is
    complete and within its size limit, so a failure never leaves a half or oversized bundle.
    """
    profile = load_profile(target)
    dest = destination_for(profile, check_python(python))
    max_mb = check_max_mb(max_mb)
    cache = cache or ArtefactCache()
    wheel_cache = wheel_cache or wheel_cache_dir()
    _check_out_dir(out_dir)
    with StagedDir(out_dir) as staged:
        report = _assemble(target, profile, dest, staged.path, cache, models, wheel_cache)
        if report.total_bytes > max_mb * 1e6:
            raise BundleError(
                f"the {target} bundle is {report.total_bytes / 1e6:.1f} MB, over its "
                f"{max_mb:g} MB limit: {report.sizes}"
            )
        _check_out_dir(out_dir)
        staged.publish(replace=True)
    report.out_dir = out_dir
    return report


def _assemble(
    target: str,
    profile: TargetProfile,
    dest: Destination,
    out_dir: Path,
    cache: ArtefactCache,
    models: Sequence[str],
    wheel_cache: Path,
) -> BundleReport:
    report = BundleReport(target, out_dir, dest)
    plan: dict[str, Any] = {"device": "cuda" if profile.is_cuda else "cpu", "models": []}
    for unit in load_models(models):
        artefact = cache.get_or_build(unit.model, unit.weights, profile)
        lib, _ = export_to(artefact, out_dir / "artefacts")
        entries = write_cases(make_cases(unit), out_dir, CASE_LAYOUT)
        plan["models"].append(
            {"name": unit.model.name, "library": f"artefacts/{lib.name}", "cases": entries}
        )
        report.models[unit.model.name] = {
            "library": f"artefacts/{lib.name}",
            "sha256": file_sha256(lib),
            "weights": unit.weights_source,
            "cases": len(entries),
        }
    site = out_dir / "site"
    copy_runtime_package(dest, site, wheel_cache)
    ffi = fetch_wheel("apache-tvm-ffi", tvmx.TVM_FFI_VERSION, dest, wheel_cache)
    (out_dir / "wheels").mkdir()
    shutil.copy2(ffi, out_dir / "wheels" / ffi.name)
    cuda_lib = site / "tvm" / tvmx.CUDA_RUNTIME_LIBRARY
    if profile.is_cuda:
        needed = ElfFile.read(cuda_lib).needed_libraries()
        report.requires = {lib: why for lib, why in SYSTEM_LIBRARIES.items() if lib in needed}
    else:
        # A CPU bundle never loads the CUDA plug-in, and without it needs no CUDA at all.
        cuda_lib.unlink(missing_ok=True)
    report.sizes["tvm_runtime_package"] = _tree_bytes(site)
    report.sizes["tvm_ffi_wheel"] = ffi.stat().st_size
    report.sizes["artefacts"] = _tree_bytes(out_dir / "artefacts")
    report.sizes["cases"] = _tree_bytes(out_dir / "cases")
    shutil.copyfile(runner.__file__, out_dir / RUNNER)
    (out_dir / runner.PLAN).write_text(json.dumps(plan, indent=2) + "\n")
    (out_dir / "README.txt").write_text(_readme(report))
    report.sizes["runner_and_plan"] = sum(
        (out_dir / n).stat().st_size for n in (RUNNER, runner.PLAN, "README.txt")
    )
    (out_dir / MANIFEST).write_text(json.dumps(report.to_json(), indent=2, sort_keys=True) + "\n")
    return report


def format_report(report: BundleReport) -> str:
    lines = [
        f"{report.target} bundle in {report.out_dir} for {report.destination.machine} "
        f"CPython {report.destination.python}: {report.total_bytes / 1e6:.1f} MB",
    ]
    lines += [f"  {part:<20} {size / 1e6:>7.2f} MB" for part, size in report.sizes.items()]
    lines += [f"  needs {lib}: {why}" for lib, why in report.requires.items()]
    lines.append(f"  check it there: python3 {report.out_dir.name}/{RUNNER}")
    return "\n".join(lines)
