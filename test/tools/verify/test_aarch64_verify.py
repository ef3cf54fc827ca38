"""The aarch64 build runs under qemu and matches x86 and NumPy at every parity count (slow)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from dynshape_perception.compiler.cache import ArtefactCache
from dynshape_perception.models import MODEL_NAMES, model_definition
from dynshape_perception.tools.verify.aarch64 import format_report, verify_aarch64
from dynshape_perception.tools.verify.common import compare, parity_counts
from dynshape_perception.tools.verify.emulator import (
    EmulatedPython,
    default_emu_dir,
    ensure_emulator,
    missing_tools,
)


def _show(request: pytest.FixtureRequest, text: str) -> None:
    """Write past pytest's capture, so the emulation's cost shows in every `make test` log."""
    reporter = request.config.pluginmanager.get_plugin("terminalreporter")
    capture = request.config.pluginmanager.get_plugin("capturemanager")
    if reporter is None or capture is None:
        return
    with capture.global_and_fixture_disabled():
        reporter.ensure_newline()
        reporter.write_line(text)


@pytest.fixture(scope="module")
def emulator(request: pytest.FixtureRequest) -> EmulatedPython:
    python = EmulatedPython.at(default_emu_dir())
    if python.ready:
        return python
    missing = missing_tools()
    if missing:
        reason = f"aarch64 emulation needs {', '.join(missing)} (make system-deps)"
        if os.environ.get("CI") == "true":
            pytest.fail(reason)
        pytest.skip(reason)
    started = time.perf_counter()
    python = ensure_emulator()
    _show(request, f"[aarch64] set up {default_emu_dir()} in {time.perf_counter() - started:.1f} s")
    return python


def test_tolerance_is_relative_above_one_and_absolute_below() -> None:
    ref = np.array([0.5, 200.0], np.float32)
    assert compare([ref + np.float32(0.9e-4)], [ref]).ok
    assert not compare([ref + np.array([1.1e-4, 0], np.float32)], [ref]).ok
    assert compare([ref + np.array([0, 0.018], np.float32)], [ref]).ok
    assert not compare([ref + np.array([0, 0.022], np.float32)], [ref]).ok
    assert not compare([ref[:1]], [ref]).ok
    assert not compare([np.array([np.nan, 200.0], np.float32)], [ref]).ok


def test_counts_include_zero_and_every_bound() -> None:
    assert parity_counts(model_definition("segmenter").spec.bounds) == [
        0,
        1,
        2,
        7,
        64,
        1000,
        150000,
    ]
    assert parity_counts(model_definition("associator").spec.bounds) == [0, 1, 2, 7, 64, 128]


@pytest.mark.slow
def test_every_model_matches_x86_and_numpy_under_emulation(
    emulator: EmulatedPython, cache_root: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    started = time.perf_counter()
    report = verify_aarch64(ArtefactCache(cache_root), tmp_path, emulator=emulator)
    _show(request, f"[aarch64] {time.perf_counter() - started:.1f} s\n{format_report(report)}")
    data = report.to_json()
    assert set(data) == {"models", "target"} and data["target"] == "aarch64"
    assert set(data["models"]) == set(MODEL_NAMES)
    for name, entry in data["models"].items():
        bounds = model_definition(name).spec.bounds
        assert entry["counts"] == parity_counts(bounds), name
        assert entry["elf_machine"] == "AArch64"
        assert entry["ok"], (name, [c for c in entry["per_count"] if not c["ok"]])
        assert entry["max_abs_diff"] < 1e-3 and entry["max_abs_diff_x86"] < 1e-3
    segmenter = data["models"]["segmenter"]["per_count"]
    assert segmenter[-1]["dims"] == {"P": 150_000}
    assert report.ok
