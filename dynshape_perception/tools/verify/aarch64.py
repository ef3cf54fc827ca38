"""Prove the aarch64 build: run it under qemu on the parity counts, against x86 and NumPy."""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from dynshape_perception.compiler import standalone_runner as runner
from dynshape_perception.compiler.cache import ArtefactCache
from dynshape_perception.compiler.standalone_runner import RTOL
from dynshape_perception.compiler.targets import load_profile
from dynshape_perception.models import MODEL_NAMES
from dynshape_perception.runtime.executable import LoadedModel
from dynshape_perception.tools.verify.common import (
    Case,
    Comparison,
    VerifyError,
    compare,
    load_arrays,
    load_models,
    make_cases,
    write_cases,
)
from dynshape_perception.tools.verify.elf import EM_AARCH64, ElfFile
from dynshape_perception.tools.verify.emulator import EmulatedPython, ensure_emulator

log = logging.getLogger(__name__)

TARGET = "aarch64"
HOST_PROFILE = "x86_64"
# Where the emulated runner finds each case and writes what it computed, under the work dir.
CASE_LAYOUT = {
    "inputs": "inputs/{key}.npz",
    "expected": "expected/{key}.npz",
    "outputs": "outputs/{key}.npz",
}


@dataclass(frozen=True)
class FunctionResult:
    reference: Comparison
    x86: Comparison
    x86_reference: Comparison
    run_s: float

    @property
    def ok(self) -> bool:
        return self.reference.ok and self.x86.ok and self.x86_reference.ok


@dataclass
class CountResult:
    count: int
    dims: dict[str, int]
    functions: dict[str, FunctionResult] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return all(f.ok for f in self.functions.values())

    @property
    def max_abs_diff(self) -> float:
        return max((f.reference.max_abs_diff for f in self.functions.values()), default=0.0)

    @property
    def max_abs_diff_x86(self) -> float:
        return max((f.x86.max_abs_diff for f in self.functions.values()), default=0.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "count": self.count,
            "dims": self.dims,
            "max_abs_diff": self.max_abs_diff,
            "max_abs_diff_x86": self.max_abs_diff_x86,
            "ok": self.ok,
            "functions": {
                name: {
                    "max_abs_diff": f.reference.max_abs_diff,
                    "max_abs_diff_x86": f.x86.max_abs_diff,
                    "x86_vs_reference": f.x86_reference.max_abs_diff,
                    "emulated_run_s": f.run_s,
                    **({"error": f.reference.detail or f.x86.detail} if not f.ok else {}),
                }
                for name, f in self.functions.items()
            },
        }


@dataclass
class ModelResult:
    name: str
    weights: str
    library: Path
    elf_machine: str
    load_s: float = 0.0
    counts: list[CountResult] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.counts)

    @property
    def max_abs_diff(self) -> float:
        return max((c.max_abs_diff for c in self.counts), default=0.0)

    @property
    def max_abs_diff_x86(self) -> float:
        return max((c.max_abs_diff_x86 for c in self.counts), default=0.0)

    def to_json(self) -> dict[str, Any]:
        return {
            "max_abs_diff": self.max_abs_diff,
            "counts": [c.count for c in self.counts],
            "max_abs_diff_x86": self.max_abs_diff_x86,
            "ok": self.ok,
            "weights": self.weights,
            "library": str(self.library),
            "elf_machine": self.elf_machine,
            "emulated_load_s": self.load_s,
            "per_count": [c.to_json() for c in self.counts],
        }


@dataclass
class Aarch64Report:
    models: dict[str, ModelResult]
    timings: dict[str, float]

    @property
    def ok(self) -> bool:
        return all(m.ok for m in self.models.values())

    def to_json(self) -> dict[str, Any]:
        return {"models": {n: m.to_json() for n, m in self.models.items()}, "target": TARGET}


@dataclass
class _Prepared:
    result: ModelResult
    cases: list[Case]
    x86_outputs: list[list[np.ndarray]]


def _prepare(
    cache: ArtefactCache, names: Sequence[str], work_dir: Path
) -> tuple[list[_Prepared], dict[str, Any]]:
    """Build (or fetch) both libraries, write every case's inputs and run the x86 build."""
    arm, host = load_profile(TARGET), load_profile(HOST_PROFILE)
    prepared: list[_Prepared] = []
    plan: dict[str, Any] = {"device": "cpu", "models": []}
    for unit in load_models(names):
        arm_art = cache.get_or_build(unit.model, unit.weights, arm)
        elf = ElfFile.read(arm_art.library_path)
        if elf.machine != EM_AARCH64:
            raise VerifyError(f"{arm_art.library_path} is {elf.machine_name}, not AArch64")
        host_model = LoadedModel(
            unit.model, cache.get_or_build(unit.model, unit.weights, host).library_path
        )
        cases = make_cases(unit)
        entries = write_cases(cases, work_dir, CASE_LAYOUT)
        plan["models"].append(
            {"name": unit.model.name, "library": str(arm_art.library_path), "cases": entries}
        )
        x86 = [host_model(case.function, *case.inputs) for case in cases]
        result = ModelResult(
            unit.model.name, unit.weights_source, arm_art.library_path, elf.machine_name
        )
        prepared.append(_Prepared(result, cases, x86))
    return prepared, plan


def _run_emulated(emulator: EmulatedPython, work_dir: Path, plan: dict[str, Any]) -> dict[str, Any]:
    """All models and counts in one emulated process: TVM's import alone costs seconds there."""
    script = work_dir / "runner.py"
    shutil.copyfile(runner.__file__, script)
    plan_path = work_dir / runner.PLAN
    plan_path.write_text(json.dumps(plan, indent=2))
    report_path = work_dir / "emulated_report.json"
    # A reused work dir holds the last run's report and outputs: a runner that fails without
    # writing new ones must not pass on them.
    report_path.unlink(missing_ok=True)
    shutil.rmtree(work_dir / "outputs", ignore_errors=True)
    proc = emulator.run(script, ["--plan", str(plan_path), "--json", str(report_path)])
    if proc.returncode not in (0, 1) or not report_path.is_file():
        raise VerifyError(
            f"the emulated aarch64 runner failed (exit {proc.returncode}):\n"
            f"{(proc.stdout + proc.stderr)[-4000:]}"
        )
    report: dict[str, Any] = json.loads(report_path.read_text())
    return report


def verify_aarch64(
    cache: ArtefactCache,
    work_dir: Path,
    models: Sequence[str] = MODEL_NAMES,
    emulator: EmulatedPython | None = None,
) -> Aarch64Report:
    """Compile for aarch64 (and x86_64), run under emulation, compare with x86 and NumPy."""
    work_dir.mkdir(parents=True, exist_ok=True)
    timings: dict[str, float] = {}
    started = time.perf_counter()
    emulator = emulator or ensure_emulator()
    timings["emulator_setup_s"] = time.perf_counter() - started
    started = time.perf_counter()
    prepared, plan = _prepare(cache, models, work_dir)
    timings["build_and_x86_s"] = time.perf_counter() - started
    started = time.perf_counter()
    emulated = _run_emulated(emulator, work_dir, plan)
    timings["emulated_s"] = time.perf_counter() - started
    timings["emulated_import_s"] = float(emulated.get("import_s", 0.0))
    results: dict[str, ModelResult] = {}
    for prep in prepared:
        result = prep.result
        model_report = emulated["models"][result.name]
        result.load_s = float(model_report["load_s"])
        run_s = {row["key"]: float(row["run_s"]) for row in model_report["cases"]}
        by_count: dict[int, CountResult] = {}
        for case, x86 in zip(prep.cases, prep.x86_outputs, strict=True):
            arm = load_arrays(work_dir / CASE_LAYOUT["outputs"].format(key=case.key))
            entry = by_count.setdefault(case.count, CountResult(case.count, case.dims))
            entry.functions[case.function] = FunctionResult(
                reference=compare(arm, case.expected),
                x86=compare(arm, x86),
                x86_reference=compare(x86, case.expected),
                run_s=run_s[case.key],
            )
        result.counts = list(by_count.values())
        results[result.name] = result
    return Aarch64Report(results, timings)


def format_report(report: Aarch64Report) -> str:
    lines = [f"{'model':<11} {'count':>7}  {'vs NumPy':>10}  {'vs x86':>10}  {'qemu s':>7}"]
    for name, model in report.models.items():
        for c in model.counts:
            run_s = sum(f.run_s for f in c.functions.values())
            flag = "" if c.ok else "  FAILED"
            lines.append(
                f"{name:<11} {c.count:>7}  {c.max_abs_diff:>10.3g}  {c.max_abs_diff_x86:>10.3g}"
                f"  {run_s:>7.2f}{flag}"
            )
        lines.append(
            f"{name:<11} {'all':>7}  {model.max_abs_diff:>10.3g}  {model.max_abs_diff_x86:>10.3g}"
            f"  ({model.weights})"
        )
    t = report.timings
    verdict = f"all within {RTOL:g} x max(1, |ref|)" if report.ok else "FAILED"
    lines.append(
        f"build + x86 {t.get('build_and_x86_s', 0):.1f} s, emulated run "
        f"{t.get('emulated_s', 0):.1f} s (TVM import {t.get('emulated_import_s', 0):.1f} s); "
        + verdict
    )
    return "\n".join(lines)
