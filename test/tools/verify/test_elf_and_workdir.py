"""Corrupt ELF files and stale emulator results fail as VerifyError, never pass or crash."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from dynshape_perception.tools.verify import aarch64
from dynshape_perception.tools.verify.common import VerifyError, save_arrays
from dynshape_perception.tools.verify.elf import ElfFile


def _elf_bytes() -> bytes:
    data = Path(sys.executable).resolve().read_bytes()
    assert data[:4] == b"\x7fELF"
    return data


def test_a_whole_elf_parses() -> None:
    elf = ElfFile(_elf_bytes(), "python")
    assert elf.sections and elf.machine_name


@pytest.mark.parametrize("keep", [64, 200, 4096, 0.5])
def test_a_truncated_elf_is_a_verify_error(tmp_path: Path, keep: float) -> None:
    data = _elf_bytes()
    cut = tmp_path / "truncated.so"
    cut.write_bytes(data[: int(len(data) * keep) if keep < 1 else int(keep)])
    with pytest.raises(VerifyError, match="truncated or corrupt ELF"):
        ElfFile.read(cut)


def test_corrupt_section_offsets_are_a_verify_error() -> None:
    elf = ElfFile(_elf_bytes(), "python")
    bad = next(i for i, s in enumerate(elf.sections) if s.kind == 11)  # SHT_DYNSYM
    sections = list(elf.sections)
    sections[bad] = type(sections[bad])(**{**vars(sections[bad]), "offset": len(elf.data)})
    elf.sections = sections
    with pytest.raises(VerifyError, match="truncated or corrupt ELF"):
        elf.function_names()


class SilentRunnerFaultInjector:
    """An emulated Python whose runner exits 0 but writes no report and no outputs."""

    def __init__(self) -> None:
        self.stale_at_launch: list[Path] = []

    def run(self, script: Path, args: list[str]) -> subprocess.CompletedProcess[str]:
        work = script.parent
        self.stale_at_launch = [
            p for p in (work / "emulated_report.json", work / "outputs") if p.exists()
        ]
        return subprocess.CompletedProcess([str(script)], 0, "", "")


def test_a_reused_work_dir_never_passes_on_the_previous_run(tmp_path: Path) -> None:
    (tmp_path / "emulated_report.json").write_text(json.dumps({"models": {}, "import_s": 1.0}))
    save_arrays(tmp_path / "outputs" / "segmenter_0.npz", [])
    runner = SilentRunnerFaultInjector()
    with pytest.raises(VerifyError, match="emulated aarch64 runner failed"):
        aarch64._run_emulated(runner, tmp_path, {"device": "cpu", "models": []})  # type: ignore[arg-type]
    assert runner.stale_at_launch == []
    assert not (tmp_path / "outputs").exists()
